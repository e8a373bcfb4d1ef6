"""Benchmarks and the chaos run; a package so that ``bench.chaos_app`` can be the Celery
app of the chaos run's beat and worker processes, and the test suite can import the run."""
