"""torch's own TCPStore client against our c10d store (launcher/store), for tests/c10d_store_test.sh.

  c10d_store_client.py ops PORT            every store operation, the waits' timeouts, bad clients
  c10d_store_client.py apart PORT_A PORT_B two stores hold their own keys
  c10d_store_client.py set_later PORT KEY VALUE SECONDS
  c10d_store_client.py over_limit PORT BYTES a value over the server's limit closes that client only
  c10d_store_client.py pg                  init_process_group("gloo", "env://") + all_reduce (env: RANK...)
  c10d_store_client.py count PORT MIN      the store holds at least MIN keys
Each prints "ok: ..." lines and exits 0, or raises (a traceback, exit 1).
"""
import datetime
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist


def store(port, seconds=30):
    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=seconds))


def expect(what, got, want):
    if got != want:
        raise AssertionError(f"{what}: got {got!r}, want {want!r}")
    print(f"ok: {what}")


def timed(fn):
    start = time.monotonic()
    try:
        fn()
    except Exception as e:  # DistStoreError, RuntimeError: the client's own timeout
        return time.monotonic() - start, e
    return time.monotonic() - start, None


def ops(port):
    s = store(port)  # connect: VALIDATE, then PING (its nonce echoed)
    s.set("k", b"v\x00\xff")
    expect("set/get binary", s.get("k"), b"v\x00\xff")
    big = bytes(range(256)) * (8 << 12)  # 8 MiB
    s.set("big", big)
    expect("set/get 8 MiB", s.get("big") == big, True)
    expect("add from nothing", s.add("n", 5), 5)
    expect("add again", s.add("n", -2), 3)
    expect("add stores decimal", s.get("n"), b"3")
    expect("compare_set match", s.compare_set("k", b"v\x00\xff", b"w"), b"w")
    expect("compare_set mismatch answers current", s.compare_set("k", b"nope", b"x"), b"w")
    expect("compare_set missing, empty expected, sets", s.compare_set("c", b"", b"first"), b"first")
    expect("compare_set missing, expected answered", s.compare_set("c2", b"exp", b"x"), b"exp")
    expect("check present", s.check(["k", "n"]), True)
    expect("check absent", s.check(["k", "c2"]), False)
    s.multi_set(["m1", "m2"], [b"one", b"two"])
    expect("multi_get", s.multi_get(["m2", "m1"]), [b"two", b"one"])
    s.append("ap", b"ab")
    s.append("ap", b"cd")
    expect("append", s.get("ap"), b"abcd")
    expect("num_keys", s.num_keys(), 7)  # k big n c m1 m2 ap
    expect("delete_key present", s.delete_key("m1"), True)
    expect("delete_key absent", s.delete_key("m1"), False)
    expect("num_keys after delete", s.num_keys(), 6)
    expect("list_keys", sorted(s.list_keys()), ["ap", "big", "c", "k", "m2", "n"])
    s.queue_push("q", b"i1")
    s.queue_push("q", b"i2")
    expect("queue_len", s.queue_len("q"), 2)
    expect("queue_pop", s.queue_pop("q", False), b"i1")
    expect("queue_pop blocking", s.queue_pop("q", True), b"i2")
    expect("queue_len empty", s.queue_len("q"), 0)
    _, err = timed(lambda: s.queue_pop("q", False))
    expect("queue_pop empty raises", type(err).__name__, "QueueEmptyError")

    elapsed, err = timed(lambda: s.wait(["never"], datetime.timedelta(seconds=1)))
    if err is None or not 0.9 <= elapsed <= 10:
        raise AssertionError(f"wait for a key that never comes: {err!r} after {elapsed:.2f} s")
    print(f"ok: wait timeout: {type(err).__name__} after {elapsed:.2f} s: {err}")
    # The connection goes on after the client's CANCEL_WAIT.
    expect("get after a timed-out wait", s.get("n"), b"3")
    short = store(port, seconds=1)
    elapsed, err = timed(lambda: short.get("never"))
    if err is None or not 0.9 <= elapsed <= 10:
        raise AssertionError(f"get of a key that never comes: {err!r} after {elapsed:.2f} s")
    print(f"ok: get timeout: {type(err).__name__} after {elapsed:.2f} s")

    setter = subprocess.Popen([sys.executable, __file__, "set_later", str(port), "late", "hello", "1.0"])
    try:
        elapsed, err = timed(lambda: s.wait(["late"], datetime.timedelta(seconds=60)))
    finally:
        setter.wait(timeout=60)
    if err is not None or elapsed > 60:
        raise AssertionError(f"wait for another client's later set: {err!r} after {elapsed:.2f} s")
    expect("setter exited 0", setter.returncode, 0)
    expect(f"wait ended by another client's set ({elapsed:.2f} s)", s.get("late"), b"hello")

    bad_clients(port)
    expect("served after bad clients", s.get("n"), b"3")


def bad_clients(port):
    for name, payload in [("no VALIDATE first", b"\x03\x01\x00\x00\x00\x00\x00\x00\x00k"),
                          ("wrong magic", b"\x00\x01\x02\x03\x04"),
                          ("unknown query type", b"\x00\xce\xf7\x85\x3c\xc8")]:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            raw.sendall(payload)
            try:
                closed = raw.recv(1) == b""
            except ConnectionResetError:
                closed = True
            expect(f"bad client closed: {name}", closed, True)


def apart(port_a, port_b):
    a, b = store(port_a), store(port_b)
    a.set("only_a", b"1")
    expect("key set on store A is not on store B", b.check(["only_a"]), False)
    expect("store A has it", a.check(["only_a"]), True)


def set_later(port, key, value, seconds):
    s = store(port)
    time.sleep(float(seconds))
    s.set(key, value.encode())


def over_limit(port, limit):
    victim, other = store(port), store(port)
    victim.set("small", b"x")
    try:  # no answer to a SET: the close shows here (a reset while sending) or at the next call
        victim.set("huge", b"y" * (int(limit) + 1))
    except Exception as e:
        print(f"ok: the SET over the limit failed: {type(e).__name__}")
    elapsed, err = timed(lambda: victim.get("small"))
    if err is None:
        raise AssertionError("a value over the limit: the client was not closed")
    print(f"ok: value over the limit closed its client ({type(err).__name__} after {elapsed:.2f} s)")
    expect("other client served", other.get("small"), b"x")
    expect("the huge value was not stored", other.check(["huge"]), False)


def pg():
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    expect(f"rank {rank} all_reduce sum", t.item(), 3.0)
    dist.barrier()
    dist.destroy_process_group()


def count(port, minimum):
    n = store(port).num_keys()
    if n < int(minimum):
        raise AssertionError(f"the store holds {n} keys, want at least {minimum}")
    print(f"ok: the store holds {n} keys (the process group's)")


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    ports = [int(a) for a in args[:2] if a.isdigit()]
    {"ops": lambda: ops(ports[0]),
     "apart": lambda: apart(*ports),
     "set_later": lambda: set_later(ports[0], *args[1:]),
     "over_limit": lambda: over_limit(ports[0], args[1]),
     "pg": pg,
     "count": lambda: count(ports[0], args[1])}[command]()
