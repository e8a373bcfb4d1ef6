"""Integrations of beat-claims with frameworks."""
