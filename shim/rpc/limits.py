"""What a peer of the daemon's socket may make the server hold, and the budgets that end a connection that abuses
it: the numbers, why each is what it is, and the small pure counters that apply them (no I/O; a clock is passed in).

The references are the servers the kubelet's side of the socket already trusts: grpc-go (the kubelet's and crictl's
gRPC, and containerd's server), Go's net/http2 and grpc core (grpcio). Where they differ, the stricter one that
never cuts a well-behaved client is taken, and the comment says which. A legitimate client here is the kubelet (one
long-lived connection, a few hundred calls a second at most, no keepalive pings), crictl (a connection per command),
probectl and the tests' grpcio clients.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# --- what a connection holds -----------------------------------------------------------------------------------

# SETTINGS_MAX_CONCURRENT_STREAMS, counted as calls whose handler still runs (Go's net/http2 after CVE-2023-44487
# counts handlers, not streams: a reset stream whose handler has not ended yet still takes a slot). A stream beyond
# it is refused (RST_STREAM REFUSED_STREAM: the client may retry it, it was never seen by a handler).
CONCURRENT_CALLS = 4096
# Calls across every connection. Beyond it a new call is answered at once, Trailers-Only RESOURCE_EXHAUSTED: 8192
# parked WatchProbeStatus calls held 70-78 MiB (about 9.5 KB each, the handler's own state included). The kubelet's
# probes of a full node (110 pods with 3 probes each, all bridged) are some 330 calls at once. A client that parks
# this many calls (two connections suffice) has the kubelet's calls refused meanwhile: the bound is for the
# daemon's memory, not isolation between clients. Isolation is the socket's access control (0660, root and
# socket_group): a client that may connect may also stop every pod of the node through the proxied CRI.
SERVER_CALLS = 8192
# Connections at once. Beyond it a new one gets GOAWAY ENHANCE_YOUR_CALM and is closed. A connection with a call
# held about 3 KB (1,044 of them: +3.6 MiB), an attacker's far more only while its calls and buffers last.
SERVER_CONNECTIONS = 1024

# The receive windows the server announces (a client's requests): Go's net/http2 server's upload buffers are 1 MiB
# a stream; a connection's is 4 here so that a few uploads go at full speed at once. They are given back as the
# handler takes the data, so they bound what a client may have sent ahead of its handlers' reads: 4 MiB on a
# connection. CRI and ProbeService requests are a few KiB; a larger message still arrives (below).
REQUEST_STREAM_WINDOW = 1024 * 1024
REQUEST_CONNECTION_WINDOW = 4 * 1024 * 1024

# Request bytes a connection's calls hold unread (whole messages a handler has not taken, and the parts of
# messages still arriving). The receive windows bound what a client may send ahead of its handler's reads, but a
# message larger than the window must be let in as it arrives, or it could never complete: 48 calls each sending
# all but the last byte of a 4 MiB message held 192 MiB (grpcio's server, and this one before these limits). The
# call whose bytes cross the limit ends RESOURCE_EXHAUSTED and what it held is dropped. Two of the largest CRI
# messages (16 MiB, the kubelet's limit) fit.
CONNECTION_INBOUND_BYTES = 32 * 1024 * 1024

# A header block as the client sends it (HEADERS + CONTINUATION), before decoding. Beyond it the connection ends
# (ENHANCE_YOUR_CALM): the block cannot be skipped without decoding it (the HPACK table must follow the client's),
# and a peer that sends 4x the advertised limit is not a gRPC client (grpc-go's and grpc core's clients check the
# limit before sending). Decoding a block costs at most about 64 bytes per byte of it (an indexed field is one
# byte, a tuple in Python), so 16 MiB at worst, for a moment.
HEADER_BLOCK_BYTES = 256 * 1024
# SETTINGS_MAX_HEADER_LIST_SIZE (RFC 9113 6.5.2: names + values + 32 per field, decoded). A call over it ends alone
# (Trailers-Only RESOURCE_EXHAUSTED, as grpc core answers metadata over its limit); the connection goes on.
HEADER_LIST_BYTES = 64 * 1024

# --- the write side --------------------------------------------------------------------------------------------

# Response bytes a connection's calls may have queued for the client's windows before a streaming handler's
# write() waits (each call may also queue 1 MiB of its own, call.py's WRITE_BACKLOG): without it, 64 server streams
# to a client that opens no window held 64 MiB. Reading goes on (the client's WINDOW_UPDATEs must be read).
CONNECTION_WRITE_BACKLOG = 4 * 1024 * 1024

# Frames this side queues in answer to the client (PING and SETTINGS acknowledgements, RST_STREAM, refusals) that
# are not yet written to the socket: past this many, the connection ends with GOAWAY ENHANCE_YOUR_CALM (Go's
# net/http2 maxQueuedControlFrames; grpc core stops reading at the same number, DEFAULT_MAX_PENDING_INDUCED_FRAMES:
# grpcio's server held 0.4-0.7 MiB under 3M SETTINGS frames from a client that did not read, this server 29 MiB
# before this bound).
INDUCED_FRAMES = 10_000
# The socket's write buffer: above it the transport pauses writing and the connection stops reading (asyncio's
# flow control; 64 KiB is its default high-water mark). What a call writes waits below it too.
WRITE_BUFFER_HIGH = 256 * 1024

# --- time ------------------------------------------------------------------------------------------------------

# The client preface and its first SETTINGS must arrive within this (Go's net/http2 prefaceTimeout; grpc-go waits
# 120 s, but a client on a local unix socket that is silent for 10 s is not connecting).
PREFACE_TIMEOUT_S = 10.0
# A connection with no call for this long is told GOAWAY (NO_ERROR) and closed once its last answer is out: grpc-go's
# MaxConnectionIdle, off by default there. The kubelet calls the runtime every second (PLEG relist) and so is never
# idle; a client that is reconnects on its next call, as grpc clients do after a graceful GOAWAY.
IDLE_TIMEOUT_S = 600.0
# After a GOAWAY that ends the connection (an error, the idle timeout), the socket is closed at most this long
# after: a client that does not read cannot keep it open by leaving the GOAWAY unread.
CLOSE_GRACE_S = 5.0

# --- budgets: GOAWAY ENHANCE_YOUR_CALM when one runs out -------------------------------------------------------

# Streams reset before their call ended: by the client (RST_STREAM), or by this side for a client's fault (a
# stream error, a refused stream: "made you reset", CVE-2025-8671). HTTP/2 rapid reset (CVE-2023-44487) opens and
# resets streams as fast as it can write; each costs this server about 40 us of CPU. A burst of 1000 lets a client
# cancel everything it has in flight at once (a kubelet stopping); 100 a second sustained is 0.4% of a core.
RESET_BURST = 1000
RESETS_PER_S = 100.0
# Frames that move no call forward: SETTINGS (but the client's first), PRIORITY, frames of unknown types, DATA
# without data or end, a header block fragment without bytes, a PING acknowledgement this side never asked for.
# A gRPC client sends a few per connection (grpc-go a SETTINGS per window change of its BDP estimator). Flooded,
# each costs a parse and often an answer. Frames of a stream that has just closed (DATA, WINDOW_UPDATE, RST_STREAM
# in flight, RFC 9113 5.1) are not glitches: a client that sends a large request the server refused has many.
GLITCH_BURST = 1000
GLITCHES_PER_S = 100.0
# PINGs: grpc-go's server keepalive enforcement with its defaults (keepalive.EnforcementPolicy: MinTime 5 min, no
# pings without calls, maxPingStrikes 2; grpc core's ping abuse policy is the same): a ping sooner than 5 minutes
# after the last one (2 hours when no call is open) is a strike; the third strike ends the connection with
# GOAWAY ENHANCE_YOUR_CALM "too_many_pings". Sending HEADERS or DATA forgives the strikes, so the pings grpc's
# clients send to estimate bandwidth (after each burst of data they receive) are never strikes.
PING_MIN_INTERVAL_S = 300.0
PING_MIN_INTERVAL_IDLE_S = 7200.0
PING_STRIKES = 2


@dataclass(slots=True)
class Budget:
    """A token bucket: `burst` events at once, refilled at `per_second`. `spend` says False once it is empty."""

    burst: int
    per_second: float
    tokens: float = field(init=False)
    updated: float | None = None

    def __post_init__(self) -> None:
        self.tokens = float(self.burst)

    def spend(self, now: float) -> bool:
        if self.updated is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.per_second)
        self.updated = now
        self.tokens -= 1.0
        return self.tokens >= 0.0


@dataclass(slots=True)
class PingPolicy:
    """grpc-go's http2Server.handlePing enforcement: `received` says False when the client pinged too often."""

    last_ping: float | None = None
    strikes: int = 0
    forgiven: bool = False  # this side sent HEADERS or DATA since the last ping

    def received(self, now: float, calls_open: bool) -> bool:
        last, self.last_ping = self.last_ping, now
        if self.forgiven:
            self.forgiven, self.strikes = False, 0
            return True
        interval = PING_MIN_INTERVAL_S if calls_open else PING_MIN_INTERVAL_IDLE_S
        if last is not None and now - last < interval:
            self.strikes += 1
        return self.strikes <= PING_STRIKES

    def sent_data(self) -> None:
        self.forgiven = True
