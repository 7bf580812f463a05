"""A fixed delay on the packets of one netfilter queue, held in user space: ``tc netem`` without sch_netem.

The kernel of these machines has no ``sch_netem`` (nor ``sch_prio`` or ``act_gact``: ``tc qdisc add ... netem``
answers "Specified qdisc kind is unknown"), but it has NFQUEUE. An iptables rule (``-j NFQUEUE --queue-num N
--queue-bypass``) hands each matching packet to this reader, which accepts it ``delay`` seconds after it arrived:
no packet passes before its delay is over (a lower bound, as with netem), and the order of packets is kept.

The reader speaks nfnetlink_queue directly (linux/netfilter/nfnetlink_queue.h; stdlib only) on a socket created
inside the host's network namespace: a thread of this process that entered it, so that ``ip netns pids`` of the
host never lists it and killing or pausing the host's processes leaves the delay in place, as a link delay would.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import select
import socket
import struct
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_NO_ENOBUFS = 5
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_VERDICT = 1
NFQNL_MSG_CONFIG = 2
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQNL_CFG_CMD_BIND = 1
NFQNL_CFG_CMD_UNBIND = 2
NFQNL_COPY_META = 1
NLM_F_REQUEST = 1
NLM_F_ACK = 4
NLMSG_ERROR = 2
NF_ACCEPT = 1
_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_QUEUE_MAXLEN = 16_384  # packets held at once; more are dropped by the kernel, as a full netem queue drops them
_RCVBUF = 8 << 20


def _attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


class NfqDelay:
    """Accept every packet of netfilter queue ``queue`` ``delay`` seconds after it arrived, until ``close()``.

    ``enter_namespace`` is called first in the reader's own thread (it moves that thread into the host's network
    namespace, where the queue lives). ``start()`` returns once the queue is bound, so that a rule added after it
    never meets an unbound queue (``--queue-bypass`` would let its packets pass undelayed).
    """

    def __init__(self, queue: int, delay: float, enter_namespace: Callable[[], None]) -> None:
        self.queue = queue
        self.delay = delay
        self.packets = 0  # accepted so far
        self._enter = enter_namespace
        self._stop = threading.Event()
        self._bound = threading.Event()
        self._error: BaseException | None = None
        self._seq = 0
        self._thread = threading.Thread(target=self._run, name=f"nfq-delay-{queue}", daemon=True)

    def start(self, timeout: float = 10.0) -> None:
        self._thread.start()
        if not self._bound.wait(timeout) or self._error is not None:
            self._stop.set()
            raise RuntimeError(f"Expected netfilter queue {self.queue} bound within {timeout:.0f} s, "
                               f"found {self._error or 'no answer'}") from self._error

    def close(self, timeout: float = 10.0) -> None:
        """Accept what is held at once and unbind the queue; idempotent."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        try:
            self._enter()
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        except BaseException as err:
            self._error = err
            self._bound.set()
            return
        with sock:
            try:
                self._bind(sock)
            except BaseException as err:
                self._error = err
                self._bound.set()
                return
            self._bound.set()
            held: collections.deque[tuple[float, int]] = collections.deque()
            try:
                self._loop(sock, held)
            finally:
                for _, packet_id in held:  # released undelayed: the fault is over
                    with contextlib.suppress(OSError):
                        self._verdict(sock, packet_id)
                with contextlib.suppress(OSError):
                    self._config(sock, _attr(NFQA_CFG_CMD, struct.pack(">BxH", NFQNL_CFG_CMD_UNBIND, 0)), ack=False)

    def _bind(self, sock: socket.socket) -> None:
        with contextlib.suppress(OSError):  # SO_RCVBUFFORCE needs CAP_NET_ADMIN, which root has
            sock.setsockopt(socket.SOL_SOCKET, 33, _RCVBUF)  # SO_RCVBUFFORCE
        sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
        sock.bind((0, 0))
        self._config(sock, _attr(NFQA_CFG_CMD, struct.pack(">BxH", NFQNL_CFG_CMD_BIND, 0)))
        params = _attr(NFQA_CFG_PARAMS, struct.pack(">IB", 0, NFQNL_COPY_META))  # no payload: ids only
        self._config(sock, params + _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack(">I", _QUEUE_MAXLEN)))

    def _message(self, kind: int, flags: int, body: bytes) -> bytes:
        self._seq += 1
        nfgen = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(self.queue))
        payload = nfgen + body
        return _NLMSGHDR.pack(_NLMSGHDR.size + len(payload), (NFNL_SUBSYS_QUEUE << 8) | kind, flags, self._seq, 0) \
            + payload

    def _config(self, sock: socket.socket, body: bytes, *, ack: bool = True) -> None:
        sock.send(self._message(NFQNL_MSG_CONFIG, NLM_F_REQUEST | (NLM_F_ACK if ack else 0), body))
        if not ack:
            return
        seq = self._seq
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            ready, _, _ = select.select([sock], [], [], 0.5)
            if not ready:
                continue
            data = sock.recv(65_536)
            for kind, msg_seq, payload in self._messages(data):
                if kind == NLMSG_ERROR and msg_seq == seq:
                    (error,) = struct.unpack_from("=i", payload)
                    if error != 0:
                        raise OSError(-error, f"nfnetlink_queue config of queue {self.queue} refused")
                    return
        raise TimeoutError(f"no answer from nfnetlink_queue for queue {self.queue}")

    @staticmethod
    def _messages(data: bytes) -> list[tuple[int, int, bytes]]:
        found = []
        offset = 0
        while offset + _NLMSGHDR.size <= len(data):
            length, kind, _, seq, _ = _NLMSGHDR.unpack_from(data, offset)
            if length < _NLMSGHDR.size:
                break
            found.append((kind, seq, data[offset + _NLMSGHDR.size: offset + length]))
            offset += (length + 3) & ~3
        return found

    @staticmethod
    def _packet_id(payload: bytes) -> int | None:
        offset = 4  # after the nfgenmsg
        while offset + 4 <= len(payload):
            length, kind = struct.unpack_from("=HH", payload, offset)
            if length < 4:
                return None
            if kind & 0x7FFF == NFQA_PACKET_HDR:
                return int(struct.unpack_from(">I", payload, offset + 4)[0])
            offset += (length + 3) & ~3
        return None

    def _verdict(self, sock: socket.socket, packet_id: int) -> None:
        sock.send(self._message(NFQNL_MSG_VERDICT, NLM_F_REQUEST,
                                _attr(NFQA_VERDICT_HDR, struct.pack(">II", NF_ACCEPT, packet_id))))

    def _loop(self, sock: socket.socket, held: collections.deque[tuple[float, int]]) -> None:
        packet_kind = (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET
        while not self._stop.is_set():
            now = time.monotonic()
            while held and held[0][0] <= now:
                self._verdict(sock, held.popleft()[1])
                self.packets += 1
            wait = min(held[0][0] - now, 0.2) if held else 0.2
            ready, _, _ = select.select([sock], [], [], max(wait, 0.0))
            if not ready:
                continue
            data = sock.recv(1 << 20)
            arrived = time.monotonic()
            for kind, _, payload in self._messages(data):
                if kind == packet_kind and (packet_id := self._packet_id(payload)) is not None:
                    held.append((arrived + self.delay, packet_id))
