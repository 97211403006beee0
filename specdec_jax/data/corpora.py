"""Real text corpora from the Debian archive, fetched into the cache and parsed into pairs.

No dataset hub is reachable from where this library is developed and tested, but the Debian
archive is. Three corpora come from it (see ``CORPORA`` for source, licence and record count):

* ``debian-handbook`` (EN->DE): *The Debian Administrator's Handbook* ships the same HTML book
  in en-US and de-DE; paragraphs (``<div class="para">``) align 1:1 page by page.
* ``trans-de-en`` (EN->DE): the Ding German-English dictionary; we keep its full-sentence
  example pairs only (its words and phrases are the training-only ``ding-phrases``).
* ``ui-messages`` (EN->DE, training only): the German gettext catalogues (``de/LC_MESSAGES``
  ``.mo`` files) of a pinned set of system and desktop packages, English message -> German.
* ``debian-descriptions`` (summarisation): package long description -> one-line synopsis,
  from the archive's ``Translation-en`` list.

Packages (.deb) are fetched with ``apt-get download PKG=VERSION`` into a temporary folder of the
cache (never installed, nothing written outside the cache), checked against a pinned sha256 and
unpacked with ``dpkg-deb -x`` into ``<cache>/data/<pkg>-<version>/``. When apt's lists lack the
pinned version (a fresh machine where ``apt-get update`` never ran), the lists are refreshed
once per process (as root only; otherwise the error names the command to run) and the download
is tried again. The .deb stays in ``<cache>/data/debs/``; a .deb put there by hand (e.g.
downloaded from snapshot.debian.org on a machine without apt) is used as is, after the same
hash check.

Package descriptions and reproducibility
----------------------------------------
``Translation-en`` is not a package: it is an index file of a Debian release, replaced at every
point release, so "the current list" is not a fixed thing. We therefore pin two things:

1. the list itself: the uncompressed ``bookworm/main/i18n/Translation-en`` of Debian 12.15
   (InRelease of 2026-07-11; ``DESCRIPTIONS_SOURCE``). Bookworm is oldstable: it gets few
   point releases, and none once it leaves regular support, so this file is expected to stay
   the current one for long; if a point release replaces it, the pinned file is still served
   by content address as long as the archive keeps it (snapshot.debian.org keeps it for good).
   It is read from the local apt lists when they hold this very file, otherwise downloaded by
   its content address (``dists/bookworm/main/i18n/by-hash/SHA256/...``) with ``apt-helper``
   (no root needed, the system's lists untouched) into
   ``<cache>/data/debian-descriptions-bookworm/Translation-en.xz``; a copy put there by hand
   is used too;
2. the snapshot we produce from it: the parsed pairs, one JSON object a line, written once into
   ``<cache>/data/debian-descriptions-bookworm/descriptions.jsonl`` and pinned by sha256 and
   record count (``DESCRIPTIONS_SNAPSHOT``). Every later run reads only the snapshot.

If the system has no ``Translation-en`` list at all we run
``apt-get update -o Acquire::Languages=en`` first (as root; the Docker default
``Acquire::Languages "none"`` skips these lists). A user on another day whose archive no longer
serves the pinned list gets an error naming the hashes and three ways out: copy the pinned
snapshot from a machine that has it, put the pinned list (e.g. from snapshot.debian.org) in
the cache, or set
``SPECDEC_JAX_UNPINNED_DESCRIPTIONS=1`` to build an unpinned snapshot from whatever list the
system has (its scores are then not comparable with pinned ones, and it is stored under a name
carrying its own hash).
"""

from __future__ import annotations

import dataclasses
import functools
import gettext
import hashlib
import html.parser
import io
import json
import lzma
import os
import pathlib
import re
import shutil
import subprocess
import tarfile
import tempfile
import warnings

from specdec_jax.checkpoints import fetch
from specdec_jax.runtime.progress import tqdm

DATA_SUBDIR = "data"
PREFILL = "specdec-jax fetch data"  # what fetches every corpus ahead of time
DEB_SUBDIR = "debs"
_MARKER = ".specdec_jax_sha256"  # written into an unpacked package once it is complete
_ARCHIVE_URL = "https://deb.debian.org/debian"
_SNAPSHOT_URL = "https://snapshot.debian.org/package"


@dataclasses.dataclass(frozen=True)
class DebPin:
    """One Debian package, pinned by version and by the sha256 of its .deb."""

    package: str
    version: str
    sha256: str
    pool: str  # the archive folder, for the hand-download hint
    licence: str  # from /usr/share/doc/<package>/copyright

    @property
    def filename(self) -> str:
        # apt writes a version's epoch colon as %3a ("4:7.4.7" -> "4%3a7.4.7").
        return f"{self.package}_{self.version.replace(':', '%3a')}_all.deb"


def _pins() -> tuple[dict[str, DebPin], tuple[DebPin, ...]]:
    """Every pinned package by name, and the message catalogues' pins (data file
    ``packaged/debian_pins.json``: versions and hashes are data, not code)."""
    table = json.loads((pathlib.Path(__file__).parent / "packaged" / "debian_pins.json")
                       .read_text())
    ui_messages = tuple(DebPin(**pin) for pin in table["ui_messages"])
    pins = [DebPin(**pin) for pin in table["corpora"]] + list(ui_messages)
    return {pin.package: pin for pin in pins}, ui_messages


DEBS, UI_MESSAGE_DEBS = _pins()
DEBIAN_HANDBOOK, TRANS_DE_EN, DICT_GCIDE, LIBC_L10N, PYTHON_TESTSUITE = (DEBS[name] for name in (
    "debian-handbook", "trans-de-en", "dict-gcide", "libc-l10n", "libpython3.11-testsuite"))

# Debian 12.15 (bookworm) main, InRelease "Date: Sat, 11 Jul 2026 10:16:37 UTC".
DESCRIPTIONS_SOURCE = {
    "release": "Debian 12.15 (bookworm) main, InRelease of 2026-07-11",
    "list": "dists/bookworm/main/i18n/Translation-en",
    "sha256": "62f59c3cdca9786e4f7adf9002f9f5729a684adcb4667e58e448dec9b5a46c7f",
    "size": 32699363,
    "xz_sha256": "a3d4a0bfd8e9242810b0885eda7c1a6e05dac15b333ddbaab03ba56f2dfa4bf0",
}
DESCRIPTIONS_SNAPSHOT = {
    "file": "debian-descriptions-bookworm/descriptions.jsonl",
    "sha256": "7c84027f5c46a2065fc44697ebac18ecea37a957951a765dbc9f8e0874d48114",
    "records": 53979,
}
UNPINNED_ENV = "SPECDEC_JAX_UNPINNED_DESCRIPTIONS"

# Filters (see the module docstring of text_tasks for what each corpus keeps).
MIN_WORDS = 4  # both sides of a translation pair
MAX_WORDS = 60  # both sides of a handbook pair: longer paragraphs are dropped
MIN_DESCRIPTION_WORDS = 20  # long descriptions shorter than this are dropped
MIN_SYNOPSIS_WORDS = 2  # ROUGE-2 needs a bigram in the reference
_SENTENCE_END = (".", "!", "?")
_OPENERS = "\"'„“‚‘«»"

HANDBOOK_RECORDS = 1635
DING_RECORDS = 15904
DING_PHRASE_RECORDS = 290841  # words and phrases (training-only data)
UI_MESSAGE_RECORDS = 21455  # message pairs (training-only data)
DESCRIPTION_RECORDS = DESCRIPTIONS_SNAPSHOT["records"]
GCIDE_RECORDS = 200519  # paragraphs of >= 8 words (pretraining.gcide_documents)
LIBC_DE_RECORDS = 1423  # translated messages
PYTHON_RECORDS = 722  # non-empty .py files of the test suite


@dataclasses.dataclass(frozen=True)
class Corpus:
    name: str
    source: str
    licence: str
    records: int


def _from_package(name: str, pin: DebPin, what: str, records: int) -> Corpus:
    """A corpus read from one pinned package (``what``: which of its files)."""
    return Corpus(name=name, source=f"Debian package {pin.package} {pin.version} ({what})",
                  licence=pin.licence, records=records)


CORPORA = {corpus.name: corpus for corpus in (
    _from_package("debian-handbook", DEBIAN_HANDBOOK, "html/en-US + html/de-DE",
                  HANDBOOK_RECORDS),
    _from_package("trans-de-en", TRANS_DE_EN, "Ding dictionary, /usr/share/trans/de-en",
                  DING_RECORDS),
    _from_package("ding-phrases", TRANS_DE_EN,
                  "Ding dictionary words and phrases, /usr/share/trans/de-en",
                  DING_PHRASE_RECORDS),
    Corpus(name="ui-messages",
           source="German gettext catalogues (de/LC_MESSAGES/*.mo) of the Debian 12 packages "
                  + ", ".join(f"{pin.package} {pin.version}" for pin in UI_MESSAGE_DEBS),
           licence="; ".join(f"{pin.package}: {pin.licence}" for pin in UI_MESSAGE_DEBS),
           records=UI_MESSAGE_RECORDS),
    Corpus(name="debian-descriptions",
           source=f"{DESCRIPTIONS_SOURCE['release']}, {DESCRIPTIONS_SOURCE['list']} "
                  f"(sha256 {DESCRIPTIONS_SOURCE['sha256'][:16]}...)",
           licence="each description belongs to its package and is under that package's "
                   "licence (Debian main: DFSG-free); no single licence",
           records=DESCRIPTION_RECORDS),
    # Pre-training text (specdec_jax.data.pretraining).
    _from_package("gcide", DICT_GCIDE, "/usr/share/dictd/gcide.dict.dz", GCIDE_RECORDS),
    _from_package("libc-de", LIBC_L10N, "/usr/share/locale/de/LC_MESSAGES/libc.mo",
                  LIBC_DE_RECORDS),
    _from_package("python", PYTHON_TESTSUITE, "/usr/lib/python3.11/test/**.py",
                  PYTHON_RECORDS),
)}


# --------------------------------------------------------------------------- packages


def data_dir() -> pathlib.Path:
    return fetch.cache_dir() / DATA_SUBDIR


def _hash_mismatch(path: pathlib.Path, expected: str, actual: str, fix: str) -> ValueError:
    return ValueError(f"{path}: sha256 {actual} does not match the pinned {expected}. {fix}")


_APT_UPDATE = ("apt-get", "update", "-o", "Acquire::Languages=en")
# What apt-get download says when its package lists lack the package or the pinned version:
# on a fresh machine (a Docker image, a CI runner) ``apt-get update`` was never run.
_LISTS_LACK = re.compile(r"Version '[^']*' for '[^']*' was not found|Unable to locate package")


def _is_root() -> bool:
    return getattr(os, "geteuid", lambda: -1)() == 0


@functools.cache
def _apt_update_outcome(apt_config: str | None) -> tuple[type[OSError], str] | None:
    """Runs ``apt-get update`` at most once per process and apt configuration (``APT_CONFIG``):
    None if it worked, else (error type, why not).

    Only as root (it rewrites the system's lists); otherwise nothing runs and the outcome is a
    PermissionError naming the command for the user to run. ``Acquire::Languages=en`` makes the
    same update also fetch the Translation-en lists that the package descriptions come from.
    """
    command = " ".join(_APT_UPDATE)
    if not _is_root():
        return PermissionError, (f"apt's package lists lack what is needed and only root can "
                                 f"refresh them: run `sudo {command}` (or `{command}` as root), "
                                 f"then try again")
    result = subprocess.run(list(_APT_UPDATE), capture_output=True, text=True)
    if result.returncode != 0:
        return ConnectionError, f"{command} failed: {result.stderr.strip()[-300:]}"
    return None


def _apt_update() -> None:
    """Refreshes apt's package lists once per process; raises OSError if that cannot be done."""
    if (outcome := _apt_update_outcome(os.environ.get("APT_CONFIG"))) is not None:
        error, message = outcome
        raise error(message)


def _apt_get_download(pin: DebPin, folder: str) -> subprocess.CompletedProcess:
    return subprocess.run(["apt-get", "download", f"{pin.package}={pin.version}"],
                          cwd=folder, capture_output=True, text=True)


def _apt_download(pin: DebPin, dest: pathlib.Path) -> None:
    """``apt-get download PKG=VERSION`` inside a temporary folder, then moved to ``dest``.

    When apt's lists lack the pinned version (a machine where ``apt-get update`` never ran),
    the lists are refreshed once (``_apt_update``, root only) and the download tried again.
    """
    hint = (f"Without apt, or if the archive no longer has this version, download "
            f"{_ARCHIVE_URL}/{pin.pool}/{pin.filename} (or from "
            f"{_SNAPSHOT_URL}/{pin.pool.rsplit('/', 1)[-1]}/{pin.version}/) and put it at "
            f"{dest}.")
    if shutil.which("apt-get") is None:
        raise FileNotFoundError(f"apt-get is not available to fetch {pin.filename}. {hint}")
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        result, updated = _apt_get_download(pin, tmp), ""
        if result.returncode != 0 and _LISTS_LACK.search(result.stderr):
            try:
                _apt_update()
            except OSError as err:  # one error type for every failed fetch, as offline
                raise ConnectionError(
                    f"{pin.filename} is not in the cache and apt-get download {pin.package}="
                    f"{pin.version} found no such version in apt's lists; {err}. "
                    f"{fetch.offline_hint(PREFILL)} {hint}") from None
            result, updated = _apt_get_download(pin, tmp), " (after apt-get update)"
        got = pathlib.Path(tmp) / pin.filename
        if result.returncode != 0 or not got.is_file():
            raise ConnectionError(
                f"{pin.filename} is not in the cache and apt-get download {pin.package}="
                f"{pin.version} failed{updated}:\n{result.stderr.strip()[-800:]}\n"
                f"{fetch.offline_hint(PREFILL)} The pinned version is in Debian 12 (bookworm); "
                f"add a bookworm apt source, or fetch it by hand. {hint}")
        shutil.move(got, dest)


def _unpack(deb: pathlib.Path, out: pathlib.Path) -> None:
    """``dpkg-deb -x``; without dpkg, the .deb (an ar archive) is unpacked in Python."""
    if shutil.which("dpkg-deb"):
        subprocess.run(["dpkg-deb", "-x", str(deb), str(out)], check=True,
                       capture_output=True)
        return
    with open(deb, "rb") as f:
        if f.read(8) != b"!<arch>\n":
            raise ValueError(f"{deb} is not a Debian package (no ar header).")
        while header := f.read(60):
            name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58])
            body = f.read(size + size % 2)[:size]
            if name.startswith("data.tar"):
                with tarfile.open(fileobj=io.BytesIO(body)) as tar:
                    if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12
                        tar.extractall(out, filter="data")
                    else:  # pragma: no cover
                        tar.extractall(out)  # noqa: S202 - a hash-checked Debian package
                return
    raise ValueError(f"{deb} has no data.tar member.")


def fetch_deb(pin: DebPin) -> pathlib.Path:
    """The unpacked tree of a pinned package (``<cache>/data/<pkg>-<version>``), fetched once.

    A .deb whose sha256 differs from the pin raises ValueError naming the file, both hashes
    and the fix.
    """
    root = data_dir() / f"{pin.package}-{pin.version}"
    marker = root / _MARKER
    if marker.is_file() and marker.read_text().strip() == pin.sha256:
        return root
    # Two processes unpacking at once (two test workers, two jobs) raced: one
    # deleted the tree the other had just moved in, or failed to move its own
    # over it (ENOTEMPTY). One at a time, and the second finds the first's tree.
    with fetch.cache_lock(f"deb-{pin.package}-{pin.version}"):
        if marker.is_file() and marker.read_text().strip() == pin.sha256:
            return root
        return _fetch_and_unpack(pin, root, marker)


def _fetch_and_unpack(pin: DebPin, root: pathlib.Path, marker: pathlib.Path) -> pathlib.Path:
    debs = data_dir() / DEB_SUBDIR
    debs.mkdir(parents=True, exist_ok=True)
    deb = debs / pin.filename
    with tqdm(total=3, desc=f"fetch {pin.package}", unit="step", leave=False) as bar:
        if not deb.is_file():
            _apt_download(pin, deb)
        bar.update()
        actual = fetch.sha256_file(deb)
        if actual != pin.sha256:
            raise _hash_mismatch(
                deb, pin.sha256, actual,
                f"Delete {deb} and fetch again; if the archive now serves a different "
                f"{pin.filename}, update the pin (and the record counts) in {__name__}.")
        bar.update()
        if root.exists():
            shutil.rmtree(root)  # an unpacking that did not finish
        with tempfile.TemporaryDirectory(dir=data_dir()) as tmp:
            _unpack(deb, pathlib.Path(tmp) / "tree")
            (pathlib.Path(tmp) / "tree").replace(root)
        marker.write_text(pin.sha256 + "\n")
        bar.update()
    return root


# --------------------------------------------------------------------------- translation


def _words(text: str) -> int:
    return len(text.split())


class _ParaParser(html.parser.HTMLParser):
    """Text of each ``<div class="para">`` (markup stripped); ``code`` when it holds a <pre>."""

    _VOID = frozenset({"br", "img", "hr", "meta", "link", "input", "col", "area", "wbr"})

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.paras: list[tuple[str, bool]] = []
        self._text: list[str] | None = None
        self._depth = 0
        self._code = False

    def handle_starttag(self, tag, attrs):
        if tag in self._VOID:
            return
        if self._text is not None:
            self._depth += 1
            self._code |= tag == "pre"
        elif tag == "div" and dict(attrs).get("class") == "para":
            self._text, self._depth, self._code = [], 1, False

    def handle_endtag(self, tag):
        if tag in self._VOID or self._text is None:
            return
        self._depth -= 1
        if self._depth == 0:
            self.paras.append((" ".join("".join(self._text).split()), self._code))
            self._text = None

    def handle_data(self, data):
        if self._text is not None:
            self._text.append(data)


def _paragraphs(path: pathlib.Path) -> list[tuple[str, bool]]:
    parser = _ParaParser()
    parser.feed(path.read_text(encoding="utf-8"))
    parser.close()
    return parser.paras


def handbook_pairs() -> list[tuple[str, str]]:
    """(English, German) paragraphs of the Debian Administrator's Handbook, in book order.

    Pages are read in sorted file-name order and paragraphs aligned by position; a page whose
    two versions differ in paragraph count is skipped (none does in the pinned version).
    Dropped: paragraphs holding code (<pre>), empty or identical sides (untranslated text),
    fewer than ``MIN_WORDS`` or more than ``MAX_WORDS`` words, repeated English paragraphs.
    """
    html_dir = fetch_deb(DEBIAN_HANDBOOK) / "usr/share/doc/debian-handbook/html"
    pairs, seen = [], set()
    for en_page in sorted((html_dir / "en-US").glob("*.html")):
        de_page = html_dir / "de-DE" / en_page.name
        if not de_page.is_file():
            continue
        en_paras, de_paras = _paragraphs(en_page), _paragraphs(de_page)
        if len(en_paras) != len(de_paras):
            continue
        for (en, en_code), (de, de_code) in zip(en_paras, de_paras):
            if en_code or de_code or not en or not de or en == de or en in seen:
                continue
            if not all(MIN_WORDS <= _words(s) <= MAX_WORDS for s in (en, de)):
                continue
            seen.add(en)
            pairs.append((en, de))
    return pairs


_DING_ANNOTATION = re.compile(r"\{[^}]*\}|\[[^\]]*\]|<[^>]*>|\([^)]*\)")
# Ellipses, slashes (alternatives) and placeholders (jdm./sth.) mark templates, not sentences.
_DING_TEMPLATE = re.compile(r"…|\.\.\.|/|\b(jd|jdm|jdn|jds|etw|sb|sth)\.(?=\s|$)", re.I)


def _ding_clean(text: str) -> str:
    text = " ".join(_DING_ANNOTATION.sub(" ", text).split())
    return re.sub(r" ([,.!?;:])", r"\1", text)


def _is_sentence(text: str) -> bool:
    return (_words(text) >= MIN_WORDS and text.endswith(_SENTENCE_END)
            and (text[0].isupper() or text[0] in _OPENERS) and not _DING_TEMPLATE.search(text))


def _has_end(text: str) -> bool:
    return "." in text or "!" in text or "?" in text


def _ding_entries():
    """Every aligned (English, German) sub-entry of the Ding dictionary, in file order.

    A Ding line is ``German :: English``; `` | `` separates sub-entries that align between the
    two sides (the head word, then its forms and example phrases), ``; `` separates
    alternatives. Sub-entries are paired by position; each side keeps its first alternative.
    Yields the raw (English, German) texts; callers clean them with ``_ding_clean``.
    """
    path = fetch_deb(TRANS_DE_EN) / "usr/share/trans/de-en"
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#") or " :: " not in line:
                continue
            german, english = line.rstrip("\n").split(" :: ", 1)
            de_parts, en_parts = german.split(" | "), english.split(" | ")
            if len(de_parts) != len(en_parts):
                continue
            for de, en in zip(de_parts, en_parts):
                yield en.split("; ")[0], de.split("; ")[0]


def ding_pairs() -> list[tuple[str, str]]:
    """(English, German) full-sentence pairs of the Ding dictionary, in file order.

    Sub-entries as ``_ding_entries`` gives them, annotations stripped ({m}, [coll.], <Abk.>,
    (optional words)); a pair is kept when both sides are sentences: at least ``MIN_WORDS``
    words, a capital or quote first, . ! or ? last, and no template marks. Repeated English
    sentences keep their first pair.
    """
    pairs, seen = [], set()
    for en, de in _ding_entries():
        if not (_has_end(de) and _has_end(en)):  # cheap pre-filter: most are words
            continue
        de, en = _ding_clean(de), _ding_clean(en)
        if en not in seen and _is_sentence(en) and _is_sentence(de):
            seen.add(en)
            pairs.append((en, de))
    return pairs


def ding_phrase_pairs() -> list[tuple[str, str]]:
    """(English, German) pairs of the Ding dictionary's words and phrases: every cleaned
    sub-entry that ``ding_pairs`` does not take as a sentence, without template marks
    (sb./jdn., slashes, ellipses), whose English is not one of the sentence pairs'. Training
    data only (the translation task's splits are the sentences); repeated English keeps its
    first pair."""
    sentences = {en for en, _ in ding_pairs()}
    pairs, seen = [], set()
    for en, de in _ding_entries():
        de, en = _ding_clean(de), _ding_clean(en)
        if (not en or not de or en in seen or en in sentences
                or _DING_TEMPLATE.search(en) or _DING_TEMPLATE.search(de)):
            continue
        seen.add(en)
        pairs.append((en, de))
    return pairs


# Messages that are code or markup rather than prose: printf/format fields, mnemonic and
# markup characters, gnupg's |ARG| option tables, e2fsprogs' @-abbreviations, escapes, and
# multi-line help text.
_MESSAGE_CODE = re.compile(r"[%_&@<>{}|$\\\n\t]")
_ACCELERATOR = re.compile(r"~(?=\w)")  # LibreOffice's accelerator mark: "~Open", "Op~en"


def message_catalog(path: pathlib.Path) -> dict:
    """A gettext ``.mo`` file's messages: msgid -> msgstr (plural forms keyed (msgid, n))."""
    with path.open("rb") as handle:
        return gettext.GNUTranslations(handle)._catalog


def ui_message_pairs() -> list[tuple[str, str]]:
    """(English, German) pairs of the German message catalogues of ``UI_MESSAGE_DEBS``, in
    package and file order. A message's context (msgctxt) is dropped, LibreOffice's ``~``
    accelerators removed and white space collapsed; plural forms, untranslated messages
    (German empty or equal to the English) and messages that are code or markup
    (``_MESSAGE_CODE``) are left out. Training data only; repeated English keeps its first
    pair."""
    pairs, seen = [], set()
    for pin in UI_MESSAGE_DEBS:
        root = fetch_deb(pin)
        for path in sorted(root.rglob("de/LC_MESSAGES/*.mo")):
            for msgid, msgstr in message_catalog(path).items():
                if not isinstance(msgid, str) or not isinstance(msgstr, str):
                    continue  # plural forms: (msgid, n) keys
                msgid = msgid.rsplit("\x04", 1)[-1]  # "context\x04message"
                en, de = (" ".join(_ACCELERATOR.sub("", text).split())
                          for text in (msgid, msgstr))
                if (en and de and en != de and en not in seen
                        and not _MESSAGE_CODE.search(msgid + msgstr)):
                    seen.add(en)
                    pairs.append((en, de))
    return pairs


# --------------------------------------------------------------------------- descriptions


def _normalise_description(lines: list[str]) -> str:
    """Long-description lines (leading space removed) -> one line: no " ." markers."""
    return " ".join(" ".join(line for line in lines if line.strip() != ".").split())


def parse_translation_en(text: str) -> list[dict]:
    """Description records of a ``Translation-en`` list, in list order.

    Each stanza has ``Package``, ``Description-md5`` and ``Description-en`` (the synopsis,
    then the long description on continuation lines). Kept: long descriptions of at least
    ``MIN_DESCRIPTION_WORDS`` words whose synopsis has at least ``MIN_SYNOPSIS_WORDS``. A
    long description shared by packages with different synopses is ambiguous and dropped; one
    shared with the same synopsis is kept once.
    """
    records = []
    for stanza in text.split("\n\n"):
        fields, key = {}, None
        for line in stanza.split("\n"):
            if line.startswith(" ") and key is not None:
                fields[key].append(line[1:])
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = [value.strip()]
        if "Description-en" not in fields:
            continue
        synopsis, *long_lines = fields["Description-en"]
        description = _normalise_description(long_lines)
        if (_words(synopsis) >= MIN_SYNOPSIS_WORDS
                and _words(description) >= MIN_DESCRIPTION_WORDS):
            records.append({"package": fields["Package"][0],
                            "description_md5": fields.get("Description-md5", [""])[0],
                            "synopsis": " ".join(synopsis.split()),
                            "description": description})
    synopses: dict[str, set[str]] = {}
    for record in records:
        synopses.setdefault(record["description"], set()).add(record["synopsis"])
    kept, seen = [], set()
    for record in records:
        if len(synopses[record["description"]]) == 1 and record["description"] not in seen:
            seen.add(record["description"])
            kept.append(record)
    return kept


def _apt_translation_lists() -> list[pathlib.Path]:
    """Local Translation-en lists of Debian bookworm main, as apt knows them."""
    if shutil.which("apt-get") is None:
        return []
    result = subprocess.run(
        ["apt-get", "-o", "Acquire::Languages=en", "indextargets", "--format", "$(FILENAME)",
         "Identifier: Translations", "Language: en", "Codename: bookworm", "Component: main",
         "Origin: Debian"], capture_output=True, text=True)
    return [pathlib.Path(p) for p in result.stdout.split() if pathlib.Path(p).is_file()]


def _read_apt_list(path: pathlib.Path) -> bytes:
    """An apt list file, decompressed (apt keeps them as .lz4/.gz/.xz/...)."""
    result = subprocess.run(["/usr/lib/apt/apt-helper", "cat-file", str(path)],
                            capture_output=True)
    if result.returncode != 0:
        raise OSError(f"apt-helper could not read {path}: {result.stderr.decode()[-400:]}")
    return result.stdout


def _pinned_list_path() -> pathlib.Path:
    """Where the pinned list is kept (xz, as the archive serves it); a hand-made copy works."""
    return data_dir() / "debian-descriptions-bookworm" / "Translation-en.xz"


def _pinned_list_url() -> str:
    return (f"{_ARCHIVE_URL}/dists/bookworm/main/i18n/by-hash/SHA256/"
            f"{DESCRIPTIONS_SOURCE['xz_sha256']}")


def _download_pinned_list(target: pathlib.Path) -> None:
    """The pinned list, fetched by content address from the archive (no root needed)."""
    xz_sha = DESCRIPTIONS_SOURCE["xz_sha256"]
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        partial = pathlib.Path(tmp) / target.name
        result = subprocess.run(["/usr/lib/apt/apt-helper", "download-file", _pinned_list_url(),
                                 str(partial), f"SHA256:{xz_sha}"], capture_output=True, text=True)
        if result.returncode != 0 or not partial.is_file():
            raise ConnectionError(f"the pinned Debian package descriptions are not in the cache "
                                  f"and {_pinned_list_url()} could not be fetched: "
                                  f"{result.stderr.strip()[-400:]}\n"
                                  f"{fetch.offline_hint(PREFILL)}")
        partial.replace(target)


def _translation_en() -> tuple[bytes, str]:
    """(uncompressed list, its sha256): the pinned list if it can be had at all.

    Tried in order: a copy in the cache (``_pinned_list_path``, e.g. put there by hand), the
    local apt lists (after ``apt-get update -o Acquire::Languages=en`` if there are none), a
    content-addressed download into the cache. If none is the pinned file, the local list is
    used only when ``SPECDEC_JAX_UNPINNED_DESCRIPTIONS=1``; otherwise ValueError says why.
    """
    pinned = DESCRIPTIONS_SOURCE["sha256"]
    notes, unpinned = [], None
    cached = _pinned_list_path()

    def read_cached() -> bytes | None:
        data = lzma.decompress(cached.read_bytes())
        digest = hashlib.sha256(data).hexdigest()
        if digest == pinned:
            return data
        notes.append(f"{cached} holds a list with sha256 {digest} (delete it)")
        return None

    if cached.is_file() and (data := read_cached()) is not None:
        return data, pinned
    lists = _apt_translation_lists()
    if not lists and shutil.which("apt-get"):
        try:
            _apt_update()
        except OSError as err:
            notes.append(str(err))
        lists = _apt_translation_lists()
    for path in lists:
        data = _read_apt_list(path)
        digest = hashlib.sha256(data).hexdigest()
        if digest == pinned:
            return data, digest
        notes.append(f"the local list {path} has sha256 {digest}")
        unpinned = unpinned or (data, digest)
    if not lists:
        notes.append("there is no local bookworm/main Translation-en list")
    if pathlib.Path("/usr/lib/apt/apt-helper").is_file() and not cached.is_file():
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            _download_pinned_list(cached)
            if (data := read_cached()) is not None:
                return data, pinned
        except ConnectionError as err:
            notes.append(f"the content-addressed download failed: {err}")
    if unpinned is not None and os.environ.get(UNPINNED_ENV) == "1":
        warnings.warn(f"{UNPINNED_ENV}=1: building an UNPINNED description snapshot from a list "
                      f"with sha256 {unpinned[1]}; scores are not comparable with the pinned "
                      "corpus.", stacklevel=3)
        return unpinned
    snapshot = data_dir() / DESCRIPTIONS_SNAPSHOT["file"]
    raise ValueError(
        f"cannot get the pinned package-description list ({DESCRIPTIONS_SOURCE['release']}, "
        f"{DESCRIPTIONS_SOURCE['list']}, sha256 {pinned}): " + "; ".join(notes) + ". Ways "
        f"out: (1) copy the snapshot {snapshot.name} (sha256 {DESCRIPTIONS_SNAPSHOT['sha256']}) "
        f"from a machine that has it to {snapshot}; (2) put the pinned list, xz-compressed "
        f"(sha256 {DESCRIPTIONS_SOURCE['xz_sha256']}), at {cached}: it is "
        f"{_pinned_list_url()}, also kept by snapshot.debian.org under "
        "archive/debian/<a date after 2026-07-11>/dists/bookworm/main/i18n/by-hash/...; "
        f"(3) set {UNPINNED_ENV}=1 to build an unpinned snapshot from the local list (after "
        "apt-get update -o Acquire::Languages=en; record counts and scores will differ from the "
        f"pinned ones). {fetch.offline_hint(PREFILL)}")


def _snapshot_bytes(records: list[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n"
                   for r in records).encode("utf-8")


def description_records() -> list[dict]:
    """Package-description records ({package, description_md5, synopsis, description}).

    Read from the pinned JSONL snapshot in the cache, which is built on first use (see the
    module docstring). A snapshot whose sha256 differs from the pin raises ValueError.
    """
    path = data_dir() / DESCRIPTIONS_SNAPSHOT["file"]
    expected = DESCRIPTIONS_SNAPSHOT["sha256"]
    if path.is_file():
        actual = fetch.sha256_file(path)
        if actual != expected:
            raise _hash_mismatch(path, expected, actual,
                                 "Delete it and run again to rebuild it from the pinned list.")
        return _read_jsonl(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text, source_sha = _translation_en()
    records = parse_translation_en(text.decode("utf-8"))
    blob = _snapshot_bytes(records)
    actual = hashlib.sha256(blob).hexdigest()
    if source_sha != DESCRIPTIONS_SOURCE["sha256"]:
        path = path.with_name(f"descriptions-unpinned-{source_sha[:12]}.jsonl")
    elif actual != expected:
        raise ValueError(
            f"the snapshot built from the pinned list has sha256 {actual} ({len(records)} "
            f"records), expected {expected} ({DESCRIPTIONS_SNAPSHOT['records']}): the parser in "
            f"{__name__} changed. Update DESCRIPTIONS_SNAPSHOT if the change is intended.")
    with fetch.partial_file(path) as out:  # processes building it at once: each its own copy
        out.write(blob)
    return records


def _read_jsonl(path: pathlib.Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
