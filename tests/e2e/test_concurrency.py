"""Many sandboxes and many execs at once: every answer goes to the right caller."""

import concurrent.futures
import uuid

from wrclient import chunk_bytes

N_SANDBOXES = 20
N_EXECS = 5


def test_20_sandboxes_5_execs_each(client, make_sandbox):
    with concurrent.futures.ThreadPoolExecutor(N_SANDBOXES) as pool:
        created = list(pool.map(lambda _: client.create(memory_mib=256),
                                range(N_SANDBOXES)))
    make_sandbox.ids.extend(sb["id"] for sb in created)
    ids = [sb["id"] for sb in created]
    assert len(set(ids)) == N_SANDBOXES
    assert all(sb["state"] == "running" for sb in created)

    # each sandbox gets a marker file of its own, so a mixed-up sandbox shows
    for sid in ids:
        client.write_file(sid, "/workspace/whoami", sid.encode())

    jobs = []
    for sid in ids:
        for j in range(N_EXECS):
            token = f"{sid}/{j}/{uuid.uuid4().hex}"
            jobs.append((sid, j, token))

    def run(job):
        sid, j, token = job
        # a little sleep makes the execs in one sandbox overlap
        cmd = (f"sleep 0.{j}; echo {token}; echo err-{j} >&2; cat /workspace/whoami; "
               f"exit {j + 10}")
        return job, client.exec(sid, cmd, timeout_seconds=120)

    with concurrent.futures.ThreadPoolExecutor(N_SANDBOXES * N_EXECS) as pool:
        results = list(pool.map(run, jobs))

    assert len(results) == N_SANDBOXES * N_EXECS
    for (sid, j, token), r in results:
        assert r["stdout"] == f"{token}\n{sid}", (sid, j, r)
        assert r["stderr"] == f"err-{j}\n", (sid, j, r)
        assert r["exit_code"] == j + 10
        assert r["timed_out"] is False

    with concurrent.futures.ThreadPoolExecutor(N_SANDBOXES) as pool:
        deleted = list(pool.map(client.delete, ids))
    assert all(d["deleted"] is True for d in deleted)
    remaining = {s["id"] for s in client.list()}
    assert not remaining & set(ids)


def test_concurrent_streams_and_files_in_one_sandbox(client, sandbox):
    tokens = [uuid.uuid4().hex for _ in range(8)]

    def stream_one(tok):
        with client.stream(sandbox, {"command": f"for i in 1 2 3; do echo {tok}-$i; "
                                                f"sleep 0.1; done"}) as s:
            events = s.read_all()
        out = b"".join(chunk_bytes(e) for e in events if e["type"] == "stdout").decode()
        return tok, out, events[-1]

    def file_one(tok):
        data = (tok * 1000).encode()
        client.write_file(sandbox, f"/tmp/conc-{tok}", data)
        return tok, client.read_file(sandbox, f"/tmp/conc-{tok}") == data

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        streams = list(pool.map(stream_one, tokens))
        files = list(pool.map(file_one, tokens))
    for tok, out, last in streams:
        assert out == f"{tok}-1\n{tok}-2\n{tok}-3\n"
        assert last["type"] == "exit" and last["exit_code"] == 0
    assert all(ok for _, ok in files)
