"""gRPC without grpcio's core: the daemon's server for its socket (server.py) and the CRI proxy's client to the
runtime (client.py), over a lean HTTP/2 of their own (h2_frames, h2_connection, h2_client; grpc_wire)."""
