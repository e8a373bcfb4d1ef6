"""Example tasks run on a schedule by beat-claims."""
