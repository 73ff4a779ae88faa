"""The host relay: the ranks of a host reach the server on one connection.

At the agent's defaults each rank sends a batch a second and gets its acknowledgement: at
1,024 ranks the server reads and answers ~2,000 websocket frames a second on as many
connections, and a third of its time went to that (bench/capacity.py's profile). The host
reader (pgdash_agent.reader), a process of its own started by the host's first rank, also
runs this relay: it listens on a Unix socket that only this user's processes of the same
launch on the host can find (:func:`path`: a hash of the launch's key in this user's
private directory), takes the v2 connections of the host's agents there, and carries their
frames to the server on one websocket (wire.RELAY_PATH), a rank's frame held up to
``HOLD_S`` for the others' to travel with it: ~3 frames a second per host of 8 instead of 8.
The server serves each carried agent as if it had its own connection (its
hello and token checked, its batches acknowledged, its questions asked), so the agent's
sender is unchanged: what is not acknowledged is sent again, and the server drops what it
stored already (nothing lost, nothing doubled).

Where there is no relay (none started yet, the reader off, its server refusing it), an agent
connects to the server itself; one that did so moves to the relay once it is there
(pgdash_agent.sender). When the relay leaves (its rank ended, or all were told to stop) it
takes no new agent, carries those here a moment more (``LINGER_S``: a dying rank's connection
ends by itself, with or without its goodbye, as it would have on its own), and then closes the
rest: the server takes them as closed sockets, whose ranks it gives a reconnect's grace, and
they reconnect to the server themselves at once. When it loses the server, it closes them
too, and takes its socket away until it is back.

It runs on one asyncio loop in a process of its own (:func:`main`), which the host reader
starts (:func:`spawn`) and tells to leave (SIGTERM, :func:`finish`), never in a training
process; it leaves by itself when the reader is gone (killed: it checks every
``PARENT_POLL_S``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import ssl
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from pgdash_agent.wire import RELAY_FRAME_BYTES, RELAY_PATH, WireError, decode_relay, decode_v2, \
    encode_relay, encode_v2

log = logging.getLogger("pgdash.relay")

LINGER_S = 0.6  # told to leave, it carries its agents this long more at most (see leave)
# The longest a frame waits for others to go up with it: 8 ranks at the agent's defaults make
# ~3 frames a host-second. (0.5 s made ~1.5, and the page's freshness p95 a second later at
# 1,024 ranks; 0.2 s was as fresh as direct connections: bench/capacity.py --wire v2,relay.)
HOLD_S = 0.2
RETRY_S = (1.0, 10.0)  # reconnection back-off to the server, first and most
CLOSE_S = 0.2  # an agent's connection closed by the relay: its answer waited for this long
PING_S = 20.0  # the server is pinged this often, and given this long to answer
MAX_PATH = 100  # a Unix socket's path is at most 107 bytes on Linux
ENV = "PGDASH_RELAY_FOR"  # what the relay process is started with: {"server", "auth", "path"}
PARENT_POLL_S = 0.2  # how often the relay process checks that its reader still runs


def path(key: str) -> str | None:
    """Where the relay of a launch (its key: pgdash_agent.core's _launch_key) listens on this
    host; None where it cannot (no private directory, a path too long). Never raises."""
    from pgdash_agent import reader

    try:
        base = reader.private_dir()
    except OSError:
        return None
    if base is None:
        return None
    where = str(base / f"relay-{reader.launch_hash(key)}.sock")
    return where if len(where.encode()) <= MAX_PATH else None


class Relay:
    """Carries the agents that connect to ``sock_path`` to ``server``, on one connection whose
    hello is ``auth`` (the starting rank's, with ``reader``: this pid).

    Args:
        hold_s: how long a frame may wait for others (the first frame of an agent, its
            hello, and a closed connection go at once).
    """

    def __init__(self, server: str, auth: dict[str, Any], sock_path: str,
                 ca_file: str | None = None, hold_s: float = HOLD_S):
        self.server, self.auth, self.sock_path = server, auth, sock_path
        self.ca_file, self.hold_s = ca_file, hold_s
        self.loop = asyncio.new_event_loop()
        self.locals: dict[int, Any] = {}  # channel -> the agent's websocket
        self._next = 0
        self._pending: list[tuple[int, bytes]] = []
        self._pending_bytes = 0
        self._gone: list[tuple[int, bool]] = []
        self._any: asyncio.Event | None = None
        self._now: asyncio.Event | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="pgdash-relay", daemon=True)
        self.up = None  # the connection to the server, while there is one
        self._linger: float | None = None  # set when told to leave (leave)
        self.refused: str | None = None  # why the server will not take this relay, for good
        self.carried = 0  # agents' frames sent up
        self.served = 0  # agents that connected

    # -- any thread --------------------------------------------------------------------------

    def start(self) -> "Relay":
        self._thread.start()
        return self

    def leave(self, linger_s: float = LINGER_S) -> None:
        """Take no more agents, carry those here for ``linger_s`` more at most (all the host's
        processes are often told to stop at once: a dying rank's connection ends by itself,
        as it would on its own), then close the rest: those alive connect to the server
        themselves. Never raises; does not wait (:meth:`stop` does)."""
        try:
            self._linger = linger_s
            if self._stop is not None:
                self.loop.call_soon_threadsafe(self._stop.set)
        except Exception:
            pass

    def stop(self, timeout: float = LINGER_S + 0.3) -> None:
        """:meth:`leave` (now, unless it was called), and wait up to ``timeout`` for the end.
        Never raises."""
        if self._linger is None:
            self.leave(0.0)
        try:
            self._thread.join(timeout)
        except Exception:
            pass

    # -- the loop ----------------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._main())
        except Exception as exc:
            log.debug("pgdash relay: ended (%s)", exc)
        finally:
            self._unlink()
            self.loop.close()

    async def _main(self) -> None:
        self._any, self._now, self._stop = asyncio.Event(), asyncio.Event(), asyncio.Event()
        if self._linger is not None:  # told to leave before it began
            self._stop.set()
        wait = RETRY_S[0]
        while not self._stop.is_set():
            try:
                up = await self._connect()
            except Exception as exc:
                if self.refused is not None:
                    log.info("pgdash relay: %s; the host's ranks connect to it themselves",
                             self.refused)
                    return
                log.debug("pgdash relay: no server (%s)", exc)
                if await self._stopped_within(wait):
                    return
                wait = min(RETRY_S[1], wait * 2)
                continue
            wait = RETRY_S[0]
            await self._serve(up)
            if not self._stop.is_set():
                await self._stopped_within(RETRY_S[0])

    async def _stopped_within(self, seconds: float) -> bool:
        try:
            await asyncio.wait_for(self._stop.wait(), seconds)
            return True
        except asyncio.TimeoutError:
            return False

    async def _connect(self) -> Any:
        from websockets.asyncio.client import connect
        from websockets.exceptions import InvalidStatus

        from pgdash_agent.compact import _websocket_url

        url = _websocket_url(self.server, RELAY_PATH)
        context = None
        if url.startswith("wss://"):
            context = ssl.create_default_context(cafile=self.ca_file)
        try:
            # (pinged: a server gone without a word is noticed, and its agents let go)
            up = await connect(url, ssl=context, max_size=None, open_timeout=10,
                               ping_interval=PING_S, ping_timeout=PING_S, compression=None)
        except InvalidStatus as exc:
            if exc.response.status_code == 404:  # an older server: no relays
                self.refused = f"{self.server} does not take relays (an older pgdash)"
            raise
        await up.send(encode_v2({"auth": {**self.auth, "reader": os.getpid(), "v": 2}}))
        reply = decode_v2(await asyncio.wait_for(up.recv(), 10))
        if not (isinstance(reply, dict) and reply.get("ok")):
            await up.close()
            self.refused = f"the server refused the relay: {reply}"
            raise ConnectionError(self.refused)
        return up

    async def _serve(self, up: Any) -> None:
        """Take the host's agents while the server is there; then let them go."""
        from websockets.asyncio.server import unix_serve

        self.up = up
        self._unlink()  # one left behind by a relay that was killed
        _sweep(self.sock_path)
        server = await unix_serve(self._agent, self.sock_path, max_size=None,
                                  ping_interval=None, compression=None,
                                  close_timeout=CLOSE_S)
        os.chmod(self.sock_path, 0o600)
        flusher = asyncio.create_task(self._flush_loop(up))
        down = asyncio.create_task(self._down(up))
        stop = asyncio.create_task(self._stop.wait())
        try:
            await asyncio.wait({down, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not down.done():  # leaving: no new agents; those here a moment more
                server.close(close_connections=False)
                self._unlink()
                self.hold_s = 0.0
                self._now.set()
                end = self.loop.time() + (self._linger or 0.0)
                while self.locals and self.loop.time() < end and not down.done():
                    await asyncio.sleep(0.02)
        finally:
            server.close(close_connections=False)  # those still here are let go below
            self._unlink()
            leaving = self._stop.is_set()
            agents, self.locals = self.locals, {}
            if leaving:  # what they sent goes up, and that they are gone from here: whether
                # their processes live is not known (a rank that outlived the linger may be
                # dying too): as a closed socket, which the server gives a reconnect's grace
                self._gone.extend((number, False) for number in agents)
                await _quietly(self._flush(up))
            code, why = ((1012, "the host relay is leaving") if leaving else
                         (1011, "the host relay lost the server"))
            await asyncio.gather(*(_quietly(ws.close(code, why)) for ws in agents.values()))
            for task in (flusher, down, stop):
                task.cancel()
            self.up = None
            await _quietly(up.close())

    async def _agent(self, ws: Any) -> None:
        """One agent of the host, on its own channel until its connection ends."""
        from websockets.exceptions import ConnectionClosed

        self._next += 1
        number = self._next
        self.locals[number] = ws
        self.served += 1
        first = True
        try:
            async for frame in ws:
                if isinstance(frame, str):
                    frame = frame.encode()  # (the server answers a text frame: it says why)
                self._carry(number, frame, now=first)
                first = False
        except ConnectionClosed:
            pass
        finally:
            if self.locals.pop(number, None) is not None:  # not closed from this side
                # the agent closed it itself (its close frame came first): it is alive
                protocol = ws.protocol
                self._gone.append((number, protocol.close_rcvd is not None
                                   and bool(protocol.close_rcvd_then_sent)))
                self._now.set()
                self._any.set()

    def _carry(self, number: int, frame: bytes, now: bool = False) -> None:
        self._pending.append((number, frame))
        self._pending_bytes += len(frame)
        if now or self._pending_bytes >= RELAY_FRAME_BYTES:
            self._now.set()
        self._any.set()

    async def _flush_loop(self, up: Any) -> None:
        from websockets.exceptions import ConnectionClosed

        while True:
            await held(self._any, self._now, self.hold_s)
            try:
                await self._flush(up)
            except ConnectionClosed:  # (_down sees it too: its agents send again elsewhere)
                return

    async def _flush(self, up: Any) -> None:
        """Send what waits: RELAY_FRAME_BYTES of frames a relay frame at most (or one larger
        frame alone), and the gone channels after them."""
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        gone, self._gone = self._gone, []
        self.carried += len(pending)
        parts = chunks(pending, RELAY_FRAME_BYTES) or [[]]
        for i, part in enumerate(parts):  # the gone with the last part: after their frames
            if part or gone:
                await up.send(encode_relay(part, gone if i == len(parts) - 1 else None))

    async def _down(self, up: Any) -> None:
        """The server's frames for the agents: acks, questions, refusals."""
        from websockets.exceptions import ConnectionClosed

        try:
            async for frame in up:
                try:
                    carried = decode_relay(frame)
                except WireError:
                    log.debug("pgdash relay: the server said %r", frame[:200])
                    continue
                for number, data in carried.relay:
                    ws = self.locals.get(number)
                    if ws is not None:
                        await _quietly(ws.send(data))
                for number, reason in carried.closed:
                    ws = self.locals.pop(number, None)
                    if ws is not None:
                        await _quietly(ws.close(1008, reason))
        except ConnectionClosed:
            pass

    def _unlink(self) -> None:
        try:
            os.unlink(self.sock_path)
        except OSError:
            pass


def _sweep(mine: str) -> int:
    """Remove the sockets other relays left behind beside ``mine`` (a relay killed outright,
    or whose process ended before its thread did), as the reader's claims are swept
    (pgdash_agent.reader.sweep). Returns how many. Never raises."""
    from pgdash_agent import reader

    where = Path(mine)
    return reader.sweep(where.parent, "relay-*.sock", where, _remove_unheard)


def _remove_unheard(where: Path) -> bool:
    """Remove the relay socket at ``where`` if nobody listens on it (a live relay's stays)."""
    import socket

    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(0.2)
        probe.connect(str(where))
        return False
    except ConnectionRefusedError:
        where.unlink()
        return True
    finally:
        probe.close()


async def held(waiting: asyncio.Event, now: asyncio.Event, hold_s: float) -> None:
    """Wait until a frame waits to go up (``waiting``), then up to ``hold_s`` more for others
    to go with it, or until one must go at once (``now``); both are cleared for the next."""
    await waiting.wait()
    try:
        await asyncio.wait_for(now.wait(), hold_s)
    except asyncio.TimeoutError:
        pass
    waiting.clear()
    now.clear()


def chunks(frames: list[tuple[int, bytes]], most: int) -> list[list[tuple[int, bytes]]]:
    """``frames`` in order, split so that each part holds at most ``most`` bytes of frames
    (a larger frame is a part alone)."""
    parts: list[list[tuple[int, bytes]]] = []
    size = most + 1
    for item in frames:
        if size + len(item[1]) > most:
            parts.append([])
            size = 0
        parts[-1].append(item)
        size += len(item[1])
    return parts


async def _quietly(call: Any) -> None:
    """An agent's connection may be gone by now: that is its own business."""
    try:
        await call
    except Exception:
        pass


# -- the relay's process -------------------------------------------------------------------------

def spawn(server: str, auth: dict[str, Any], sock_path: str,
          ca_file: str | None = None) -> subprocess.Popen | None:
    """Start a relay process for the host's agents (the host reader's child). Never raises:
    None when it could not start (the host's ranks then connect to the server themselves)."""
    from pgdash_agent import reader

    return reader.spawn("pgdash_agent.relay", ENV,
                        {"server": server, "auth": auth, "path": sock_path, "ca_file": ca_file},
                        "no host relay ({}); the host's ranks connect to the server themselves")


def finish(proc: subprocess.Popen) -> None:
    """Wait for a relay process told to leave (SIGTERM) to hand its agents back; killed if it
    takes longer than its linger and a little more. Never raises."""
    from pgdash_agent import reader

    reader.wait_or_kill(proc, LINGER_S + CLOSE_S + 0.5)


def main(environ: dict[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    try:
        given = json.loads(env[ENV])
        server, auth, where = given["server"], dict(given["auth"]), str(given["path"])
        parent = int(given["parent"])
    except (KeyError, ValueError, TypeError):
        print(f"pgdash relay: started without a valid {ENV}; the host reader starts it",
              file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for training; it follows its reader
    relay = Relay(server, auth, where, given.get("ca_file"))
    # Told to stop (its reader leaving, or a scheduler's SIGTERM to the whole step): it leaves
    # with its agents carried a moment more.
    signal.signal(signal.SIGTERM, lambda *_: relay.leave())
    relay.start()
    while relay._thread.is_alive():
        relay._thread.join(PARENT_POLL_S)
        if os.getppid() != parent and relay._linger is None:  # its reader is gone (killed)
            relay.leave()
    return 0


if __name__ == "__main__":
    sys.exit(main())
