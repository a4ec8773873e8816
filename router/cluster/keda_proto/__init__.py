"""KEDA's external scaler gRPC interface: ``externalscaler.proto`` and the modules generated from
it at build time (``externalscaler_pb2*``; git-ignored, produced by ``make install`` or any
``pip install`` of warmgate through the build step in ``setup.py``)."""
