"""python -m serving.grpc_front: one gRPC front worker; serving/grpc_front/proxy.py says what it does."""

from serving.grpc_front.proxy import main

main()
