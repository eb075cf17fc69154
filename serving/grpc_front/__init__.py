"""The gRPC front (`python -m serving.grpc_front`): with a keys file, tenants' keys and rates on KServe v2 gRPC,
before tritonserver's own gRPC on loopback (proxy.py)."""
