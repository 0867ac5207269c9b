"""httpcore's HTTP/1.1 connection pool with a bookkeeping pass that stays cheap at hundreds of connections.

httpcore 1.0's `AsyncConnectionPool` re-plans the whole pool on every request start and every response
close, and its plan is quadratic in the number of connections: for each idle connection it rebuilds a
list of all connections to count them (encode/httpcore#1035, not merged as of 1.0.9). With the replay's
closed loop at 512 streams that pass took ~85% of the client's CPU, left the event loop seconds late and
cut the request rate to a third. It also hands one idle HTTP/1.1 connection to several queued requests
in one pass (all but one then fail and re-queue, another pass each) and may close an idle connection that
a queued request was just given (encode/httpcore#1110).

`LinearPool` replaces only that planning step, `_assign_requests_to_connections`, with one linear pass
that gives each idle connection to at most one request and never closes one that a request holds. The
rest (connecting, sending, the request queue, closing) is httpcore's. `netstamp.stamped_client` uses it
for plain-http connections; with http2=True it leaves the pass to httpcore. It must not do I/O: httpcore
calls it under its lock and closes the returned connections itself.
"""

from __future__ import annotations

import httpcore


class LinearPool(httpcore.AsyncConnectionPool):
    """`httpcore.AsyncConnectionPool` whose assignment pass is linear in connections and requests."""

    def _assign_requests_to_connections(self) -> list[httpcore.AsyncConnectionInterface]:
        """Drop closed connections, close expired and surplus idle ones, give queued requests a connection.

        Returns the connections to close (httpcore closes them outside its lock). A connection that a
        request holds (its response is streaming, or it was handed over and the request has not started
        on it yet) is neither handed to another request nor closed as idle; it is still closed when it
        has expired, and its request then re-queues, as in httpcore.
        """
        if self._http2:
            # Giving each idle connection to one request is right for HTTP/1.1 only (HTTP/2 multiplexes).
            return super()._assign_requests_to_connections()
        closing: list[httpcore.AsyncConnectionInterface] = []
        held = {id(r.connection) for r in self._requests if r.connection is not None}
        kept: list[httpcore.AsyncConnectionInterface] = []
        idle: list[httpcore.AsyncConnectionInterface] = []  # free to hand out or close, oldest first
        for conn in self._connections:
            if conn.is_closed():
                continue
            if conn.has_expired():
                closing.append(conn)
                continue
            kept.append(conn)
            if id(conn) not in held and conn.is_idle():
                idle.append(conn)
        surplus = len(idle) - self._max_keepalive_connections
        if surplus > 0:
            evicted = {id(conn) for conn in idle[:surplus]}
            closing.extend(idle[:surplus])
            idle = idle[surplus:]
            kept = [conn for conn in kept if id(conn) not in evicted]
        self._connections = kept

        for request in self._requests:
            if not request.is_queued():
                continue
            origin = request.request.url.origin
            match = next((c for c in idle if c.can_handle_request(origin) and c.is_available()), None)
            if match is not None:
                idle.remove(match)
                request.assign_to_connection(match)
                continue
            if len(self._connections) >= self._max_connections:
                if not idle:
                    continue  # it waits for a connection to come back; a later request may have an origin
                # The pool is full and the idle connections are all to other origins: make room.
                victim = idle.pop(0)
                self._connections.remove(victim)
                closing.append(victim)
            conn = self.create_connection(origin)
            self._connections.append(conn)
            request.assign_to_connection(conn)
        return closing
