"""warmgate: request router and scale-from-zero proxy for GPU render engines."""

import os

__version__ = "0.1.0"

# gRPC (KEDA's scaler, router/cluster/keda.py) reads this once, when it is imported. Its fork
# handlers can crash a child that warmgate forks for a `process` target while gRPC is serving; the
# child only execs its command, so it needs none of them (docs/keda.md). A setting written for
# gRPC, not a read: warmgate reads the environment only in router/config/env.py, after this.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
