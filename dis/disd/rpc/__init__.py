"""The gRPC contract, generated from proto/ by the build.  See docs/grpc-contract.md."""
