import router  # noqa: F401  # first: it sets gRPC's fork handling before any test imports grpc

pytest_plugins = ["tests.kube.fixtures"]
