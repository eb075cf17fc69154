"""What every caller of Triton's KServe v2 gRPC API builds and reads the same way: the client, the API front,
the load tests and the benchmarks. Imports only the base layer (common)."""
