"""gRPC without grpcio's core: the daemon's server for its socket (server.py, call.py) and its client to the runtime
(client.py), over a lean HTTP/2 of their own (h2_frames: the vocabulary; h2_core: what both ends do; h2_server and
h2_client: what each end does alone; grpc_wire: gRPC's rules for the header blocks; limits: what a peer may make the
server hold)."""
