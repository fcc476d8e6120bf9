"""The command line's finish: one-line usage errors, help and --version,
prompt files (size limit, stdin, BOM), --truncate, stop sequences, the new
sampling options, --seed random, -q/-v, contradictory options, closed
stdout/stderr, the conversion lock, the source-hash index and ``cache``."""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import time

import click
import models
import pytest

from test_cli_errors import assert_error, cache_models

CLI = [sys.executable, "-m", "intdet.cli"]
HASH_RE = re.compile(r"\bhash ([0-9a-f]{12})\b")
CTX = models.TINY["max_position_embeddings"]  # 256


def env_for(cache, **extra):
    e = dict(os.environ, INTDET_CACHE=str(cache), HF_HUB_OFFLINE="1", HF_HUB_CACHE=os.path.join(str(cache), "_hub"),
             PYTHONIOENCODING="utf-8")
    e.pop("INTDET_TEST_SIGNAL_AT", None)
    e.update(extra)
    return e


class R:
    def __init__(self, args, rc, out, err, cache):
        self.args, self.rc, self.cache = args, rc, cache
        self.stdout, self.stderr = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")

    def __repr__(self):
        return f"intdet {self.args}\n rc={self.rc}\n stdout={self.stdout[-1500:]!r}\n stderr={self.stderr[-3000:]!r}"


def cli(args, cache, stdin=b"", env=None, timeout=300):
    args = [str(a) for a in args]
    p = subprocess.run(CLI + args, input=stdin, capture_output=True, env=env_for(cache, **(env or {})),
                       timeout=timeout, check=False)
    return R(args, p.returncode, p.stdout, p.stderr, cache)


def last_hash(r) -> str:
    m = HASH_RE.search(r.stderr.splitlines()[-1])
    assert m, r
    return m.group(1)


def ok(r):
    assert r.rc == 0, r
    assert "Traceback" not in r.stderr, r
    return r


@pytest.fixture(scope="module")
def conv(tiny_llama_hf, tmp_path_factory):
    from intdet.convert import convert

    return convert(tiny_llama_hf, str(tmp_path_factory.mktemp("more") / "m"), progress=False)


@pytest.fixture
def cache(tmp_path):
    return tmp_path / "cache"


# ------------------------------------------------------------ usage errors, help, version


@pytest.mark.parametrize("args,needles", [
    (["generate", "--ids", "1", "-n", "abc"], ["-n", "abc"]),
    (["generate", "--ids", "1", "--bogus"], ["--bogus"]),
    (["generate", "--ids", "1", "--device", "tpu"], ["--device", "tpu"]),
    (["generate", "--ids", "1", "--weights", "int3"], ["--weights", "int3"]),
    (["generate", "--ids", "1", "--seed", "lucky"], ["--seed", "lucky"]),
    (["generate", "--ids", "1", "--truncate", "middle"], ["--truncate", "middle"]),
    (["nosuchcommand"], ["nosuchcommand"]),
    (["convert"], ["SRC"]),
    (["cache", "clean"], ["--all"]),
])
def test_usage_errors_are_one_line_exit_1(cache, args, needles):
    assert_error(cli(args, cache), *needles)


def test_help_has_types_choices_and_a_description_for_every_option(cache):
    r = ok(cli(["generate", "--help"], cache))
    for s in ("--temperature FLOAT", "--device [cpu|cuda|ref|webgpu]", "--weights [int8|int4]", "--truncate [left|right]",
              "--seed [INTEGER|random]", "--stop STR", "--min-p FLOAT", "--repeat-penalty FLOAT", "-q, --quiet"):
        assert s in r.stdout, s
    from intdet.cli import main

    def commands(group, path):  # list_commands/get_command: main imports its verbs when asked
        ctx = click.Context(group)
        for name in group.list_commands(ctx):
            cmd = group.get_command(ctx, name)
            yield f"{path} {name}", cmd
            if isinstance(cmd, click.Group):
                yield from commands(cmd, f"{path} {name}")

    missing = [f"{path} {p.opts[0]}" for path, cmd in commands(main, "intdet") for p in cmd.params
               if isinstance(p, click.Option) and not p.help]
    assert missing == []
    assert all(cmd.help for _, cmd in commands(main, "intdet"))


def test_version_names_build_and_kernel_sets(cache):
    from intdet import _core

    r = ok(cli(["--version"], cache))
    assert r.stdout.startswith("intdet version 0.")
    assert "C++ core:" in r.stdout and "CUDA module:" in r.stdout
    assert ", ".join(_core.available_isas()) in r.stdout
    assert f"in use: {_core.isa()}" in r.stdout


def test_ctrl_c_after_a_prefill_call(conv, cache):
    """Ctrl-C that lands while a prefill call runs is honoured when it
    returns: no token, the prompt's hash, exit 130."""
    args = ["generate", "-m", conv, "--ids", ",".join(["7"] * 200), "-n", "20"]
    r = cli(args, cache, env={"INTDET_TEST_SIGNAL_AT": "prefill-1"})
    assert r.rc == 130 and "Traceback" not in r.stderr, r
    last = r.stderr.splitlines()[-1]
    assert "generated 0 tok" in last and last.endswith("(interrupted)"), r
    assert "prefill - tok/s" in last, r  # the prompt did not finish: no rate over all of it
    assert last_hash(r) == last_hash(ok(cli(args[:-1] + ["0"], cache)))


# ------------------------------------------------------------ prompt files


def test_prompt_from_dev_zero_is_refused(conv, cache):
    assert_error(cli(["generate", "-m", conv, "-f", "/dev/zero"], cache, timeout=120), "-f", "/dev/zero", "MiB")
    assert_error(cli(["perplexity", "-m", conv, "-f", "/dev/zero"], cache, timeout=120), "-f", "/dev/zero", "MiB")


def test_unbounded_stdin_is_refused(conv, cache):
    with open("/dev/zero", "rb") as zero:
        p = subprocess.run(CLI + ["generate", "-m", conv, "-f", "-"], stdin=zero, capture_output=True,
                           env=env_for(cache), timeout=120, check=False)
    err = p.stderr.decode()
    assert p.returncode == 1 and err.startswith("intdet: error: -f stdin: larger than 64 MiB") and len(err.splitlines()) == 1, err


def test_huge_regular_prompt_file_refused_before_reading(conv, cache, tmp_path):
    f = tmp_path / "sparse.txt"
    with open(f, "wb") as fh:
        fh.truncate((64 << 20) + 1)
    assert_error(cli(["generate", "-m", conv, "-f", f], cache), "-f", str(f), "64 MiB")


def test_prompt_from_stdin_and_bom(conv, cache, tmp_path):
    base = ["generate", "-m", conv, "-n", "4", "--json"]
    want = json.loads(ok(cli(base + ["Hello world"], cache)).stdout)
    got = json.loads(ok(cli(base + ["-f", "-"], cache, stdin=b"Hello world")).stdout)
    assert got["hash"] == want["hash"] and got["prompt_tokens"] == want["prompt_tokens"]
    f = tmp_path / "bom.txt"
    f.write_bytes(b"\xef\xbb\xbfHello world")
    got = json.loads(ok(cli(base + ["-f", f], cache)).stdout)
    assert got["hash"] == want["hash"] and got["prompt_tokens"] == want["prompt_tokens"]


def test_ids_with_an_empty_item(conv, cache):
    assert_error(cli(["generate", "-m", conv, "--ids", "1,,2"], cache), "--ids", "1,,2", "empty")
    assert_error(cli(["generate", "-m", conv, "--ids", "1,2,"], cache), "--ids", "empty")


# ------------------------------------------------------------ truncate and context


def test_truncate_left_right_and_the_default_error(conv, cache):
    ids = [str(3 + i % 290) for i in range(300)]
    assert_error(cli(["generate", "-m", conv, "-n", "8", "--ids", ",".join(ids)], cache), "--truncate", str(CTX))
    for side, kept in (("left", ids[-(CTX - 8):]), ("right", ids[:CTX - 8])):
        r = ok(cli(["generate", "-m", conv, "-n", "8", "--truncate", side, "--ids", ",".join(ids)], cache))
        assert f"prompt {CTX - 8} tok ({300 - (CTX - 8)} cut by --truncate)" in r.stderr, r
        plain = ok(cli(["generate", "-m", conv, "-n", "8", "--ids", ",".join(kept)], cache))
        assert last_hash(r) == last_hash(plain) and r.stdout == plain.stdout


def test_context_stop_is_named_on_the_stats_line(conv, cache):
    r = ok(cli(["generate", "-m", conv, "-n", "100", "--ids", ",".join(["5"] * (CTX - 4))], cache))
    st = json.loads(ok(cli(["generate", "-m", conv, "-n", "100", "--json", "--ids", ",".join(["5"] * (CTX - 4))],
                           cache)).stdout)
    if st["stop"] != "context":
        pytest.skip(f"stopped by {st['stop']}")
    assert st["generated_tokens"] == 5
    assert r.stderr.splitlines()[-1].endswith("(stopped: context full)"), r


# ------------------------------------------------------------ stop sequences


def test_stop_sequence_spanning_tokens_is_not_printed(conv, cache):
    from intdet.model import load_model
    from intdet.tokenizer import StreamDecoder

    tok = load_model(conv).tokenizer
    base = ["generate", "-m", conv, "--ids", "1,5,9", "-n", "30"]
    full = json.loads(ok(cli(base + ["--json"], cache)).stdout)
    dec = StreamDecoder(tok, skip_special_tokens=True)
    pieces = [dec.push(t) if tok.id_to_token(t) is not None else "" for t in full["tokens"]]
    pieces[-1] += dec.flush()  # the text each token adds as it streams
    ends = [sum(len(p) for p in pieces[:i + 1]) for i in range(len(pieces))]
    text = full["text"]
    assert text == "".join(pieces)
    # a stop string spanning the boundary after token k (two chars each side), first occurring there
    for k in range(2, len(pieces) - 2):
        b = ends[k]
        stop = text[b - 2:b + 2]
        if len(pieces[k + 1]) >= 2 and len(pieces[k]) >= 1 and text.find(stop) == b - 2 and stop.strip():
            break
    else:
        pytest.skip("no suitable boundary in this generation")
    r = ok(cli(base + ["--stop", stop, "--stop", "\x01never"], cache))
    assert r.stdout == text[:b - 2] + "\n", r
    st = json.loads(ok(cli(base + ["--json", "--stop", stop], cache)).stdout)
    assert st["stop"] == "stop" and st["text"] == text[:b - 2]
    assert st["tokens"] == full["tokens"][:k + 2]  # the token completing the stop string is the last one
    cut = json.loads(ok(cli(["generate", "-m", conv, "--ids", "1,5,9", "-n", k + 2, "--json"], cache)).stdout)
    assert st["hash"] == cut["hash"]  # and it is hashed, as an EOS token is


# ------------------------------------------------------------ sampling options, seeds


def test_new_sampling_options_change_the_run_reproducibly(conv, cache):
    base = ["generate", "-m", conv, "--ids", "1,5,9", "-n", "20", "--json", "--temperature", "1.5", "--seed", "4"]
    plain = json.loads(ok(cli(base, cache)).stdout)
    for extra in (["--min-p", "0.2"], ["--repeat-penalty", "1.8", "--repeat-last-n", "-1"]):
        a = json.loads(ok(cli(base + extra, cache)).stdout)
        b = json.loads(ok(cli(base + extra, cache)).stdout)
        assert a["hash"] == b["hash"] and a["tokens"] == b["tokens"]
        assert a["tokens"] != plain["tokens"], extra


def test_repeat_penalty_applies_to_greedy(conv, cache):
    base = ["generate", "-m", conv, "--ids", "1,5,9", "-n", "30", "--json"]
    a = json.loads(ok(cli(base, cache)).stdout)
    b = json.loads(ok(cli(base + ["--repeat-penalty", "3"], cache)).stdout)
    assert a["tokens"] != b["tokens"]


def test_seed_random_is_printed_and_repeatable(conv, cache):
    base = ["generate", "-m", conv, "--ids", "1,5,9", "-n", "12", "--temperature", "1"]
    r = ok(cli(base + ["--seed", "random"], cache))
    m = re.search(r"--seed random: using --seed (\d+)", r.stderr)
    assert m, r
    again = ok(cli(base + ["--seed", m.group(1)], cache))
    assert last_hash(again) == last_hash(r) and again.stdout == r.stdout


# ------------------------------------------------------------ -q, -v, warnings


def test_first_conversion_says_so_without_v(tiny_llama_hf, tiny_qwen2_hf, cache):
    """Converting takes tens of seconds on a real model: the first run says
    so on stderr (one line), a later run does not, and -q keeps it silent."""
    base = ["generate", "--ids", "1,5", "-n", "3"]
    r = ok(cli(base + ["-m", tiny_llama_hf], cache))
    notes = [l for l in r.stderr.splitlines() if l.startswith("intdet: converting")]
    assert len(notes) == 1 and tiny_llama_hf in notes[0] and "into the cache" in notes[0], r.stderr
    assert "converting" not in ok(cli(base + ["-m", tiny_llama_hf], cache)).stderr
    q = ok(cli(base + ["-m", tiny_qwen2_hf, "-q"], cache))  # a first conversion too, quiet
    assert q.stderr == "", q.stderr


def test_quiet_and_verbose(tiny_llama_hf, cache):
    base = ["generate", "-m", tiny_llama_hf, "--ids", "1,5", "-n", "3"]
    v = ok(cli(base + ["-v"], cache))
    assert re.search(r"converting .* into the cache", v.stderr), v
    v2 = ok(cli(base + ["-v"], cache))
    assert "converting" not in v2.stderr and "loading" in v2.stderr, v2
    q = ok(cli(base + ["-q"], cache))
    assert q.stderr == "" and q.stdout == v.stdout


def test_contradictory_options(conv, cache):
    assert_error(cli(["generate", "-m", conv, "--chat", "--ids", "1,2"], cache), "--chat", "--ids")
    assert_error(cli(["generate", "-m", conv, "--system", "be brief", "hi"], cache), "--system", "--chat")
    r = ok(cli(["generate", "-m", conv, "--ids", "1,2", "-n", "2", "--top-k", "5", "--seed", "3"], cache))
    assert "intdet: warning: --top-k, --seed have no effect at --temperature 0" in r.stderr, r
    r = ok(cli(["generate", "-m", conv, "--ids", "1,2", "-n", "2", "--revision", "v1"], cache))
    assert "intdet: warning: --revision v1 is ignored" in r.stderr, r
    r = ok(cli(["generate", "-m", conv, "--ids", "1,2", "-n", "2", "--temperature", "1", "--top-k", "5"], cache))
    assert "warning" not in r.stderr, r


# ------------------------------------------------------------ closed and broken streams


def shell(cmd, cache):
    """Run ``intdet ARGS`` under sh with redirections in ``cmd`` ({} = the CLI)."""
    line = cmd.format(" ".join(f"'{a}'" for a in CLI))
    p = subprocess.run(["sh", "-c", line], capture_output=True, env=env_for(cache), timeout=300, check=False)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


@pytest.mark.parametrize("args", [
    "generate -m '{conv}' --ids 1,5,9 -n 4",
    "compress '{txt}' -o - -m '{conv}'",  # the data would go nowhere (was exit 0)
    "compress '{txt}' -o '{tmp}/c.idz' --json -m '{conv}'",  # the report would
    "decompress '{tmp}/none.idz' -o -",  # refused before the input is read
    "hash-check -m '{conv}' --steps 2",
    "bench -m '{conv}' --prompt-tokens 4 --gen-tokens 2",
])
def test_closed_stdout(conv, cache, tmp_path, args):
    txt = tmp_path / "in.txt"
    txt.write_text("hello")
    line = args.format(conv=conv, txt=txt, tmp=tmp_path)
    rc, out, err = shell(f"{{}} {line} >&-", cache)
    assert rc == 1 and "Traceback" not in err, (rc, err)
    assert err.splitlines() == ["intdet: error: standard output is closed (this command prints its result there)"]
    assert not (tmp_path / "c.idz").exists() and sorted(os.listdir(tmp_path)) == ["in.txt"]


def test_closed_stderr_keeps_the_text(conv, cache):
    want = ok(cli(["generate", "-m", conv, "--ids", "1,5,9", "-n", "6"], cache)).stdout
    rc, out, err = shell(f"{{}} generate -m '{conv}' --ids 1,5,9 -n 6 2>&-", cache)
    assert out == want and rc == 1, (rc, out)  # the stats line could not be shown
    rc, out, _ = shell(f"{{}} generate -m '{conv}' --ids 1,5,9 -n 6 -q 2>&-", cache)
    assert out == want and rc == 0


def test_broken_pipe(conv, cache):
    """A reader gone before the first write (what `| head -c1` leads to)."""
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run(CLI + ["generate", "-m", conv, "--ids", "1,5,9", "-n", "6"], stdout=w,
                           stderr=subprocess.PIPE, env=env_for(cache), timeout=300, check=False)
    finally:
        os.close(w)
    err = p.stderr.decode()
    assert p.returncode == 1 and "Traceback" not in err and "Exception ignored" not in err, (p.returncode, err)


# ------------------------------------------------------------ cache: lock, index, list, clean


def _entry_for(src, cache, monkeypatch):
    from intdet import resolve
    from intdet.convert.sources import source_sha256

    monkeypatch.setenv("INTDET_CACHE", str(cache))
    return resolve._entry_name(source_sha256(src), "int8")


def _waiters(path) -> int:
    """Processes blocked on an flock of ``path`` (/proc/locks '->' lines)."""
    st = os.stat(path)
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    with open("/proc/locks") as f:
        return sum(1 for line in f if "->" in line and dev in line)


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="needs /proc/locks")
def test_concurrent_conversions_do_the_work_once(tiny_llama_hf, cache, monkeypatch):
    name = _entry_for(tiny_llama_hf, cache, monkeypatch)
    lock_path = os.path.join(str(cache), "locks", name + ".lock")
    os.makedirs(os.path.dirname(lock_path), exist_ok=True)
    args = CLI + ["generate", "-v", "-m", tiny_llama_hf, "--ids", "1,5,9", "-n", "4"]
    with open(lock_path, "a+b") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # both runs must queue behind this one
        procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env_for(cache),
                                  stdin=subprocess.DEVNULL) for _ in range(2)]
        deadline = time.monotonic() + 240  # a bound on waiting for a state, not a timing assertion
        while _waiters(lock_path) < 2:
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "runs did not queue on the lock"
            time.sleep(0.05)
    outs = [p.communicate(timeout=300) for p in procs]
    errs = [e.decode() for _, e in outs]
    assert [p.returncode for p in procs] == [0, 0], errs
    assert all("waiting for another intdet" in e for e in errs), errs
    assert sum(len(re.findall(r"^intdet: converting .* into the cache", e, re.M)) for e in errs) == 1, errs
    assert outs[0][0] == outs[1][0]
    assert HASH_RE.search(errs[0].splitlines()[-1]).group(1) == HASH_RE.search(errs[1].splitlines()[-1]).group(1)
    assert cache_models(cache) == [name]


def test_source_hash_index(tiny_llama_gguf, tmp_path, cache):
    import shutil

    src = str(tmp_path / "m.gguf")
    shutil.copy(tiny_llama_gguf, src)
    base = ["generate", "-v", "-m", src, "--ids", "1,5", "-n", "2"]
    assert "hashing" in ok(cli(base, cache)).stderr
    idx = json.loads((cache / "sources.json").read_text())
    assert list(idx) == [os.path.abspath(src)]
    assert "hashing" not in ok(cli(base, cache)).stderr  # unchanged: from the index
    st = os.stat(src)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert "hashing" in ok(cli(base, cache)).stderr  # touched: hashed again
    assert len(cache_models(cache)) == 1


def test_cache_list_and_clean(tiny_llama_hf, tiny_llama_gguf, cache):
    assert ok(cli(["generate", "-m", tiny_llama_hf, "--ids", "1", "-n", "1"], cache))
    assert ok(cli(["generate", "-m", tiny_llama_gguf, "--ids", "1", "-n", "1", "--weights", "int8"], cache))
    outside = cache / "keep.txt"
    outside.write_text("mine")
    entries = cache_models(cache)
    assert len(entries) == 2
    r = ok(cli(["cache", "list"], cache))
    head, *lines = r.stdout.splitlines()
    assert head.split() == ["entry", "size", "weights", "source"], r
    assert sorted(line.split()[0] for line in lines) == entries
    assert all(" MiB " in line and " int8 " in line for line in lines), r
    assert any(os.path.abspath(tiny_llama_hf) in line for line in lines), r
    js = json.loads(ok(cli(["cache", "list", "--json"], cache)).stdout)
    assert [e["name"] for e in js["entries"]] == entries and all(e["bytes"] > 0 for e in js["entries"])
    for bad in ("nosuch", "..", "../keep.txt", "/etc"):
        assert_error(cli(["cache", "clean", bad], cache), "not an entry", cache_entries=entries)
    r = ok(cli(["cache", "clean", entries[0]], cache))
    assert cache_models(cache) == entries[1:]
    r = ok(cli(["cache", "clean", "--all"], cache))
    assert cache_models(cache) == [] and outside.read_text() == "mine"
    assert ok(cli(["cache", "list"], cache)).stdout == ""


# ------------------------------------------------------------ chat


def _chat_ids(conv, messages):
    from intdet.chat import conversation_ids
    from intdet.model import load_model

    return ",".join(map(str, conversation_ids(load_model(conv), messages)))


def test_chat_from_stdin(conv, cache):
    r = ok(cli(["chat", "-m", conv, "-n", "5"], cache, stdin=b"hi\nhow are you\n/reset\nhi\n"))
    hashes = HASH_RE.findall(r.stderr)
    assert len(hashes) == 3 and "conversation cleared" in r.stderr, r
    replies = r.stdout.split("\n")
    one = ok(cli(["generate", "-m", conv, "-n", "5", "--chat", "hi"], cache))
    assert hashes[0] == hashes[2] == last_hash(one)  # after /reset the conversation starts again
    assert replies[0] + "\n" == one.stdout
    # turn 2 is generated from the whole conversation: user, assistant, user
    hist = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": replies[0]},
            {"role": "user", "content": "how are you"}]
    two = ok(cli(["generate", "-m", conv, "-n", "5", "--ids", _chat_ids(conv, hist)], cache))
    assert hashes[1] == last_hash(two)


def test_chat_skips_a_line_that_is_not_utf8(conv, cache):
    r = ok(cli(["chat", "-m", conv, "-n", "5"], cache, stdin=b"ab\xff\nhi\n"))
    assert "that line is not valid UTF-8 (byte 2); it was not sent" in r.stderr, r.stderr
    one = ok(cli(["generate", "-m", conv, "-n", "5", "--chat", "hi"], cache))
    assert HASH_RE.findall(r.stderr) == [last_hash(one)]  # the next line is the conversation's first


def test_chat_system_prompt(conv, cache):
    r = ok(cli(["chat", "-m", conv, "-n", "5", "--system", "Be brief."], cache, stdin=b"hi\n"))
    g = ok(cli(["generate", "-m", conv, "-n", "5", "--chat", "--system", "Be brief.", "hi"], cache))
    plain = ok(cli(["generate", "-m", conv, "-n", "5", "--chat", "hi"], cache))
    assert HASH_RE.findall(r.stderr) == [last_hash(g)]
    assert last_hash(g) != last_hash(plain)
    want = _chat_ids(conv, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])
    assert last_hash(ok(cli(["generate", "-m", conv, "-n", "5", "--ids", want], cache))) == last_hash(g)


def test_chat_help_and_unknown_command(conv, cache):
    r = ok(cli(["chat", "-m", conv, "-n", "2", "-q"], cache, stdin=b"/help\n/nope\n"))
    assert "/reset" in r.stdout and "unknown command /nope" in r.stderr


def test_chat_under_a_pty(conv, cache):
    import pty
    import select

    master, slave = pty.openpty()
    p = subprocess.Popen(CLI + ["chat", "-m", conv, "-n", "4"], stdin=slave, stdout=slave, stderr=slave,
                         env=env_for(cache), close_fds=True)
    os.close(slave)
    buf = b""

    def read_until(pat, limit=240):
        nonlocal buf
        deadline = time.monotonic() + limit  # bound on waiting for output, not a timing assertion
        while not re.search(pat, buf):
            assert time.monotonic() < deadline, buf
            r, _, _ = select.select([master], [], [], 1)
            if r:
                try:
                    buf += os.read(master, 4096)
                except OSError:
                    break
        return buf

    try:
        read_until(rb"> ")
        os.write(master, b"hi\n")
        read_until(rb"hash [0-9a-f]{12}")
        read_until(rb"hash [0-9a-f]{12}[\s\S]*> ")
        os.write(master, b"\x04")  # Ctrl-D leaves
        assert p.wait(timeout=120) == 0
    finally:
        if p.poll() is None:
            p.kill()
        os.close(master)
    one = ok(cli(["generate", "-m", conv, "-n", "4", "--chat", "hi"], cache))
    assert last_hash(one).encode() in buf and b"Traceback" not in buf


def test_chat_interrupted_in_decode_keeps_its_decode_rate(conv):
    """Ctrl-C during a chat reply's decode (chat.run_chat on the scheduler):
    the reply stops, keeps the tokens made so far, and its stats give the
    rate they were made at, not '-'."""
    import io

    from intdet.chat import run_chat
    from intdet.model import Engine, load_model
    from intdet.sampling import Sampler

    class Out(io.StringIO):  # Ctrl-C while the 5th piece of text is written
        n = 0

        def write(self, s):
            if s and s != "\n":
                Out.n += 1
                if Out.n == 5:
                    raise KeyboardInterrupt
            return super().write(s)

    lm = load_model(conv)
    lm.tok_meta["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    stats = []
    n = run_chat(Engine(lm), lm, Sampler(), 20, inp=io.StringIO("hello there\nagain\n"), out=Out(),
                 err=io.StringIO(), tty=False, stats_line=lambda g: stats.append(g) or "")
    assert n == 2
    g = stats[0]
    st = g.stats()
    assert g.stop == "interrupted" and len(g.tokens) >= 5 and stats[1].stop in ("length", "eos")
    assert st["prefill_tok_s"] and st["decode_tok_s"] and st["decode_tok_s"] > 0


def test_chat_runs_through_llm(conv, monkeypatch):
    """chat.run_chat drives each reply through ``LLM.run`` (the one loop
    that cancels and retires on Ctrl-C), on an LLM without a prefix cache."""
    import io

    import intdet.api
    from intdet.chat import run_chat
    from intdet.model import Engine, load_model
    from intdet.sampling import Sampler

    runs = []
    real = intdet.api.LLM.run

    def run(self, reqs, until=None):
        runs.append((len(reqs), self.scheduler.cache))
        return real(self, reqs, until)

    monkeypatch.setattr(intdet.api.LLM, "run", run)
    lm = load_model(conv)
    lm.tok_meta["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    out = io.StringIO()
    assert run_chat(Engine(lm), lm, Sampler(), 4, inp=io.StringIO("hello\nagain\n"), out=out, err=io.StringIO(),
                    tty=False) == 2
    assert runs == [(1, None), (1, None)] and out.getvalue().count("\n") == 2
