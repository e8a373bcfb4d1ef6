"""A Django site for the Django integration tests (pytest-django), PostgreSQL by default."""
