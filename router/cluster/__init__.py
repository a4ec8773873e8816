"""Several warmgate replicas (peers, Lease, fencing, shared activity, budget); the KEDA scaler."""
