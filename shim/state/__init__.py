"""What the daemon knows of its probes: registrations, results, the status board and its watch, the store."""
