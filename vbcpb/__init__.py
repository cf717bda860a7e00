"""Generated gRPC and protobuf code for proto/vbcpb/vbc.proto (do not edit; run `make proto`)."""
