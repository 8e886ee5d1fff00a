"""The webhook's TLS: TLS 1.2 or newer, HTTP/1.1 by ALPN, a certificate and key from files, and rotation without
a restart (cert-manager and `kubectl create secret` update the mounted Secret in place; the kubelet swaps the
files atomically through a symlink).

Every handshake asks for the current context (OpenSSL's servername callback runs for each ClientHello, with or
without SNI, before the certificate is chosen): when the files' identity (device, inode, size, mtime of each, the
symlink followed) has changed since the last load, they are loaded into a new context, which that handshake and
every later one use. A pair that does not load (caught between the two files being written) keeps the last good
context and is tried again at the next handshake, so a rotation is served to the next client once both are there.
"""

from __future__ import annotations

import logging
import os
import ssl
from dataclasses import dataclass

log = logging.getLogger(__name__)


def _identity(path: str) -> tuple:
    st = os.stat(path)  # follows the symlink a mounted Secret's files are
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    context.load_cert_chain(cert_file, key_file)
    return context


@dataclass
class ReloadingContext:
    cert_file: str
    key_file: str
    reloads: int = 0                   # successful loads after the first
    failures: int = 0                  # loads that failed (the last good context stayed)
    _current: ssl.SSLContext | None = None
    _loaded: tuple = ()

    def listening_context(self) -> ssl.SSLContext:
        """The context to listen with: the first load (errors raised: the webhook does not start without a
        certificate), with the callback that hands each handshake the current one."""
        self._current = server_context(self.cert_file, self.key_file)
        self._loaded = self._files()
        self._current.sni_callback = self._on_hello
        return self._current

    def _files(self) -> tuple:
        return _identity(self.cert_file), _identity(self.key_file)

    def current(self) -> ssl.SSLContext:
        try:
            files = self._files()
        except OSError:
            return self._current  # a file missing for a moment in a rotation
        if files != self._loaded:
            try:
                fresh = server_context(self.cert_file, self.key_file)
            except (OSError, ssl.SSLError) as exc:
                self.failures += 1
                log.warning("new certificate files do not load yet: %s (serving the last good one)", exc)
                return self._current
            fresh.sni_callback = self._on_hello
            self._current, self._loaded = fresh, files
            self.reloads += 1
            log.info("certificate reloaded", extra={"cert_file": self.cert_file})
        return self._current

    def _on_hello(self, ssl_object, _server_name, _context) -> None:
        context = self.current()
        if ssl_object.context is not context:
            ssl_object.context = context
