"""PickStore (cpp/core/pick_store.cpp): measured choices kept on disk across processes.

A file is trusted whole or not at all: foreign, corrupt, truncated or garbage files load as {} with
one warning; stores merge under a lock and replace the file by rename, so concurrent writers lose
nothing and concurrent readers never see part of a file.
"""

import multiprocessing
import os
import string

import pytest

_ops = pytest.importorskip("ftbert._ops", reason="ftbert._ops (the op-test module) is not built")

# Every character a key or value may hold, including spaces and non-ASCII (stored as UTF-8).
ALPHABET = string.ascii_letters + string.digits + " :=/,._-+()[]éß→"


def random_text(rng, min_len=1, max_len=24):
    n = int(rng.integers(min_len, max_len + 1))
    return "".join(ALPHABET[i] for i in rng.integers(0, len(ALPHABET), n))


def random_entries(rng, n):
    entries = {}
    while len(entries) < n:
        entries[random_text(rng)] = random_text(rng, min_len=0)
    return entries


def random_identity(rng):
    return f"gpu={random_text(rng, 4, 12)} driver={int(rng.integers(500, 600))} format=1"


def warning_lines(capfd):
    return capfd.readouterr().err.splitlines()


def assert_ignored(capfd, store):
    """load() gives {} and exactly one warning naming the file."""
    assert store.load() == {}
    lines = warning_lines(capfd)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"ftbert: warning: ignoring {store.path}: "), lines


@pytest.fixture
def stored(tmp_path, rng):
    """A valid file of a dozen random entries: (store, entries, the file's bytes)."""
    store = _ops.PickStore(str(tmp_path / "picks.txt"), random_identity(rng))
    entries = random_entries(rng, 12)
    assert store.store(entries)
    with open(store.path, "rb") as f:
        return store, entries, f.read()


def test_round_trip_in_a_fresh_store_object(tmp_path, rng, capfd):
    identity = random_identity(rng)
    entries = random_entries(rng, 40)
    path = tmp_path / "a" / "b" / "picks.txt"  # missing folders are created
    assert _ops.PickStore(str(path), identity).store(entries)
    assert _ops.PickStore(str(path), identity).load() == entries
    assert capfd.readouterr().err == ""


def test_file_format_is_header_entries_and_closing_line(stored):
    store, entries, data = stored
    lines = data.decode().split("\n")
    assert lines[-1] == ""  # every line ends in '\n'
    assert lines[0] == f"ftbert-picks\t1\t{store.identity}"
    body = [line.split("\t") for line in lines[1:-2]]
    assert {k: v for k, v, _ in body} == entries
    assert all(len(s) == 16 and set(s) <= set("0123456789abcdef") for _, _, s in body)
    name, count, checksum = lines[-2].split("\t")
    assert (name, count, len(checksum)) == ("ftbert-picks-end", str(len(entries)), 16)


def fnv1a(data, h=0xCBF29CE484222325):
    for b in data:
        h = ((h ^ b) * 0x100000001B3) % 2**64
    return h


def pick_file(identity, lines):
    """The bytes of a pick file of `lines` [(key, value, entry checksum)], per pick_store.h."""
    text = f"ftbert-picks\t1\t{identity}\n".encode()
    text += b"".join(f"{k}\t{v}\t{s:016x}\n".encode() for k, v, s in lines)
    return text + f"ftbert-picks-end\t{len(lines)}\t{fnv1a(text):016x}\n".encode()


def test_a_file_written_to_the_documented_format_loads(tmp_path, rng, capfd):
    store = _ops.PickStore(str(tmp_path / "picks.txt"), random_identity(rng))
    entries = random_entries(rng, 10)
    lines = [(k, v, fnv1a(f"{k}\t{v}".encode())) for k, v in entries.items()]
    with open(store.path, "wb") as f:
        f.write(pick_file(store.identity, lines))
    assert store.load() == entries
    assert capfd.readouterr().err == ""


def test_an_entry_checksum_is_checked_even_when_the_file_checksum_holds(tmp_path, rng, capfd):
    store = _ops.PickStore(str(tmp_path / "picks.txt"), random_identity(rng))
    entries = random_entries(rng, 10)
    lines = [(k, v, fnv1a(f"{k}\t{v}".encode())) for k, v in entries.items()]
    k, v, s = lines[3]
    lines[3] = (k, v + "x", s)  # the value changed, its checksum did not
    with open(store.path, "wb") as f:
        f.write(pick_file(store.identity, lines))
    assert store.load() == {}
    err = capfd.readouterr().err
    assert err == f"ftbert: warning: ignoring {store.path}: line 5: checksum mismatch\n"


def test_missing_file_gives_nothing_and_no_warning(tmp_path, rng, capfd):
    store = _ops.PickStore(str(tmp_path / "nothing-here" / "picks.txt"), random_identity(rng))
    assert store.load() == {}
    assert capfd.readouterr().err == ""


def test_foreign_identity_gives_nothing_with_a_warning(stored, rng, capfd):
    store, entries, _ = stored
    foreign = _ops.PickStore(store.path, store.identity + " other")
    assert_ignored(capfd, foreign)
    assert store.load() == entries  # loading does not harm the file for its own identity


def test_any_flipped_bit_gives_nothing_with_a_warning(stored, rng, capfd):
    store, _, data = stored
    for offset in range(len(data)):
        corrupt = bytearray(data)
        corrupt[offset] ^= 1 << int(rng.integers(0, 8))
        with open(store.path, "wb") as f:
            f.write(corrupt)
        assert_ignored(capfd, store)


def test_truncated_file_gives_nothing_with_a_warning(stored, capfd):
    store, _, data = stored
    # Every 7 bytes, the file without its last newline, and at each line boundary (a file cut
    # between whole lines, which only the closing line's count and checksum can catch).
    line_ends = [i + 1 for i, b in enumerate(data[:-1]) if b == ord("\n")]
    for cut in sorted(set(range(0, len(data), 7)) | {len(data) - 1} | set(line_ends)):
        with open(store.path, "wb") as f:
            f.write(data[:cut])
        assert_ignored(capfd, store)


@pytest.mark.parametrize("size", [1, 64, 4096])
@pytest.mark.parametrize("after_header", [False, True])
def test_binary_garbage_gives_nothing_with_a_warning(stored, rng, capfd, size, after_header):
    store, _, data = stored
    garbage = rng.bytes(size)
    if after_header:  # a valid header line, then garbage
        garbage = data[: data.index(b"\n") + 1] + garbage
    with open(store.path, "wb") as f:
        f.write(garbage)
    assert_ignored(capfd, store)


def test_unreadable_path_gives_nothing_with_a_warning(tmp_path, rng, capfd):
    (tmp_path / "picks.txt").mkdir()  # a folder where the file should be
    assert_ignored(capfd, _ops.PickStore(str(tmp_path / "picks.txt"), random_identity(rng)))


def test_store_over_a_corrupt_file_replaces_it(stored, rng, capfd):
    store, _, data = stored
    with open(store.path, "wb") as f:
        f.write(data[: len(data) // 2])
    fresh = random_entries(rng, 5)
    assert store.store(fresh)
    assert store.load() == fresh
    assert capfd.readouterr().err == ""


def test_store_over_a_foreign_file_replaces_it(stored, rng, capfd):
    store, _, _ = stored
    other = _ops.PickStore(store.path, store.identity + " v2")
    fresh = random_entries(rng, 5)
    assert other.store(fresh)
    assert other.load() == fresh
    assert capfd.readouterr().err == ""
    assert_ignored(capfd, store)


def test_merge_keeps_other_keys_and_ours_win(stored, rng):
    store, entries, _ = stored
    keys = sorted(entries)
    ours = {k: entries[k] + "-new" for k in keys[:4]}
    ours.update(random_entries(rng, 6))
    assert store.store(ours)
    expected = dict(entries)
    expected.update(ours)
    assert store.load() == expected
    assert store.store({})  # an empty store keeps everything
    assert store.load() == expected


def _store_keys_one_at_a_time(path, identity, prefix, count, barrier):
    """Worker of the two-process test: `count` stores of one key each, starting with the others."""
    store = _ops.PickStore(path, identity)
    barrier.wait(timeout=120)
    for i in range(count):
        if not store.store({f"{prefix}-{i:03d}": f"value {prefix} {i}"}):
            raise SystemExit(f"store {i} failed")


def test_two_processes_storing_at_once_lose_nothing(tmp_path, rng, capfd):
    path, identity, count = str(tmp_path / "picks.txt"), random_identity(rng), 150
    prefixes = [f"p{j}-{random_text(rng, 4, 8)}" for j in range(2)]
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(prefixes) + 1)
    workers = [
        ctx.Process(target=_store_keys_one_at_a_time, args=(path, identity, p, count, barrier))
        for p in prefixes
    ]
    for w in workers:
        w.start()
    reader = _ops.PickStore(path, identity)
    try:
        barrier.wait(timeout=120)
        # Meanwhile this process reads: every file it sees is whole, so what it loads only grows.
        seen, loads = {}, 0
        while any(w.is_alive() for w in workers):
            now = reader.load()
            assert set(seen.items()) <= set(now.items())
            seen, loads = now, loads + 1
        for w in workers:
            w.join(timeout=120)
    finally:
        for w in workers:
            if w.is_alive():
                w.kill()
    assert [w.exitcode for w in workers] == [0, 0]
    assert capfd.readouterr().err == ""
    expected = {f"{p}-{i:03d}": f"value {p} {i}" for p in prefixes for i in range(count)}
    assert reader.load() == expected
    assert loads > 0


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores folder permissions")
@pytest.mark.parametrize("earlier_store", [False, True], ids=["fresh", "lock-file-exists"])
def test_unwritable_folder_gives_false_and_a_warning(tmp_path, rng, capfd, earlier_store):
    folder = tmp_path / "ro"
    folder.mkdir()
    store = _ops.PickStore(str(folder / "picks.txt"), random_identity(rng))
    before = random_entries(rng, 3) if earlier_store else {}
    if earlier_store:
        assert store.store(before)
    folder.chmod(0o500)
    try:
        assert store.store(random_entries(rng, 3)) is False
        lines = warning_lines(capfd)
        assert len(lines) == 1, lines
        assert lines[0].startswith(f"ftbert: warning: cannot store {store.path}: ")
        assert store.load() == before  # the old file is untouched
    finally:
        folder.chmod(0o700)


def test_folder_that_is_a_file_gives_false_and_a_warning(tmp_path, rng, capfd):
    (tmp_path / "file").write_text("not a folder")
    store = _ops.PickStore(str(tmp_path / "file" / "sub" / "picks.txt"), random_identity(rng))
    assert store.store(random_entries(rng, 3)) is False
    lines = warning_lines(capfd)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"ftbert: warning: cannot store {store.path}: ")


@pytest.mark.parametrize(
    "bad, says",
    [
        ({"": "v"}, "empty"),
        ({"a\nb": "v"}, "newline"),
        ({"a\tb": "v"}, "tab"),
        ({"a\rb": "v"}, "carriage return"),
        ({"k": "a\nb"}, "newline"),
        ({"k": "a\tb"}, "tab"),
        ({"k": "a\rb"}, "carriage return"),
    ],
)
def test_bad_keys_and_values_raise_value_error_and_write_nothing(stored, bad, says):
    store, entries, data = stored
    mixed = {"a-good-key": "a good value", **bad}  # the good entry is not stored either
    with pytest.raises(ValueError, match=says):
        store.store(mixed)
    with open(store.path, "rb") as f:
        assert f.read() == data
    assert store.load() == entries


@pytest.mark.parametrize(
    "path, identity", [("", "id"), ("picks.txt", "two\nlines"), ("picks.txt", "a\rb")]
)
def test_bad_path_or_identity_raise_value_error(path, identity):
    with pytest.raises(ValueError, match="PickStore"):
        _ops.PickStore(path, identity)


def test_default_dir_honours_ftbert_cache_dir_then_xdg_then_home(tmp_path, monkeypatch):
    cache, xdg, home = (str(tmp_path / name) for name in ("cache", "xdg", "home"))
    env = {"FTBERT_CACHE_DIR": cache, "XDG_CACHE_HOME": xdg, "HOME": home}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert _ops.pick_store_default_dir() == cache
    monkeypatch.setenv("FTBERT_CACHE_DIR", "")  # empty counts as unset
    assert _ops.pick_store_default_dir() == xdg + "/ftbert"
    monkeypatch.delenv("FTBERT_CACHE_DIR")
    assert _ops.pick_store_default_dir() == xdg + "/ftbert"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # the XDG spec says to ignore it
    assert _ops.pick_store_default_dir() == home + "/.cache/ftbert"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert _ops.pick_store_default_dir() == home + "/.cache/ftbert"
    monkeypatch.delenv("HOME")
    assert _ops.pick_store_default_dir() == ""
