"""warmgate load tests and the `make bench` harness (see loadtests/bench.py)."""
