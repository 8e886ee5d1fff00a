"""The daemon's gRPC server (server.py): grpc.aio's server interface over a lean HTTP/2 connection of our own."""
