"""The ProbeService API: the gRPC servicer and the checks of its requests."""
