#!/usr/bin/env python3
"""Build the training corpus of the bundled tiny DeepSeek-V4 model from Debian packages.

Usage: python3 tools/train/prepare_corpus.py [--out .train-data] [--debs DIR]

What it does, deterministically (same packages -> byte-identical output):
  1. `apt-get download` the pinned packages below into a temporary folder (or use --debs, a
     folder that already holds the .deb files) and `dpkg -x` each into its own folder.
     Nothing is installed on the system.
  2. Turns each package's text into documents (one file, one Bible chapter, or one chunk of
     a long single-file manual = one document), with light cleaning: reStructuredText roles
     and directives, POD markup and HTML tags are reduced to their text; whitespace is
     normalised; documents shorter than 200 characters are dropped.
  3. Splits by document hash: sha256("<package>/<doc name>"), documents whose first 4 bytes
     mod 1000 < 15 (1.5 %) go to validation, the rest to training.
  4. Writes <out>/train.jsonl.xz and <out>/val.jsonl.xz ({"src", "name", "text"} per line, in
     a fixed order: package order below, then document name) and <out>/corpus_manifest.json
     (package versions, licences, document and byte counts, sha256 of the outputs).

The output folder is git-ignored (.git/info/exclude: /.train-data/); nothing large is committed.
Licences (from /usr/share/doc/<pkg>/copyright inside each package) are listed in PACKAGES and
repeated in models/deepseek-v4-tiny/README.md.
"""

import argparse
import glob
import gzip
import hashlib
import html
import html.parser
import json
import lzma
import os
import re
import subprocess
import sys
import tempfile

# name, version pinned to Debian 12 (bookworm) at the time of writing, licence summary
PACKAGES = [
    ("bible-kjv-text", "4.38", "King James Bible text: public domain; Debian packaging GPL-2+"),
    ("bible-kjv", "4.38", "reader program (used only to decode bible-kjv-text's data file; no text taken): GPL-2+"),
    ("python3.11-doc", "3.11.2-6+deb12u9", "Python 3.11 documentation: PSF License Version 2 (documentation part of the Python distribution)"),
    ("linux-doc-6.1", "6.1.192-3", "Linux kernel documentation: GPL-2 (some files GPL-2+/LGPL-2.1/BSD, see package copyright)"),
    ("perl-doc", "5.36.0-7+deb12u4", "Perl 5.36 POD documentation: GPL-1+ or Artistic"),
    ("jargon-text", "4.4.7-4.1", "The Jargon File 4.4.7: public domain"),
    ("gnu-standards", "2022.03.23-0.1", "GNU Coding Standards / Information for Maintainers: GFDL-1.3 (no invariant sections)"),
    ("debian-reference-en", "2.100", "Debian Reference: GPL-2+"),
]

VAL_PER_MILLE = 15
MIN_DOC_CHARS = 200
CHUNK_CHARS = 6000  # long single-file manuals are cut at paragraph boundaries into ~6 kB documents

# --------------------------------------------------------------------------------------------
# Cleaning
# --------------------------------------------------------------------------------------------

_RST_ROLE = re.compile(r":[a-zA-Z0-9_.:+-]+:`([^`<]*?)(?:\s*<[^>]*>)?`")
_RST_LINK = re.compile(r"`([^`<]+?)\s*<[^>]*>`_+")
_RST_REF = re.compile(r"`([^`]+)`_+")
_RST_LIT = re.compile(r"``([^`]+)``")
_RST_EMPH = re.compile(r"\*\*([^*\n]+)\*\*|\*([^*\s][^*\n]*)\*")
_RST_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+.:_])\1{2,}\s*$")
_RST_DIRECTIVE_DROP = re.compile(
    r"^\s*\.\. (index|_[^:]*|\|[^|]*\||toctree|include|image|figure|only|raw|highlight|"
    r"kernel-doc|kernel-abi|kernel-feat|kernel-include|c:namespace|SPDX-License-Identifier|"
    r"sectionauthor|moduleauthor|versionadded|versionchanged|deprecated|tabularcolumns|csv-table|"
    r"flat-table|cssclass|contents|default-domain|currentmodule|module|testsetup|testcleanup|"
    r"audit-event)\b.*$"
)


def clean_rst(text):
    out, skip_indent = [], None
    for line in text.split("\n"):
        if skip_indent is not None:
            # options / bodies of a dropped directive: indented lines right after it
            if line.strip() == "" or (len(line) - len(line.lstrip())) > skip_indent:
                if line.strip() == "":
                    skip_indent = None
                continue
            skip_indent = None
        if _RST_DIRECTIVE_DROP.match(line):
            skip_indent = len(line) - len(line.lstrip())
            continue
        if line.strip().startswith(".. ") and "::" not in line:
            continue  # comments
        if _RST_UNDERLINE.match(line):
            continue
        line = re.sub(r"^(\s*)\.\. [a-zA-Z:-]+::\s*", r"\1", line)  # keep the argument of kept directives
        line = _RST_LINK.sub(r"\1", line)
        line = _RST_ROLE.sub(lambda m: m.group(1).lstrip("~!"), line)
        line = _RST_LIT.sub(r"\1", line)
        line = _RST_REF.sub(r"\1", line)
        line = _RST_EMPH.sub(lambda m: m.group(1) or m.group(2), line)
        out.append(line.rstrip())
    return "\n".join(out)


_POD_FMT = re.compile(r"[BICFSLXZE]<<+\s+(.*?)\s+>>+|[BICFSLXZE]<([^<>]*)>")
_POD_ESC = {"lt": "<", "gt": ">", "verbar": "|", "sol": "/", "quot": '"', "amp": "&"}


def clean_pod(text):
    out, keep = [], True
    for line in text.split("\n"):
        if line.startswith("=begin") or line.startswith("=for"):
            keep = False
            continue
        if line.startswith("=end"):
            keep = True
            continue
        if not keep or line.startswith("=cut") or line.startswith("=pod") or line.startswith("=encoding"):
            continue
        if line.startswith("=over") or line.startswith("=back"):
            continue
        m = re.match(r"=(head\d|item)\s*(.*)", line)
        if m:
            line = m.group(2)
        for _ in range(4):  # nested codes
            def repl(mm):
                inner = mm.group(1) if mm.group(1) is not None else mm.group(2)
                code = mm.group(0)[0]
                if code == "E":
                    return _POD_ESC.get(inner, "")
                if code in "XZ":
                    return ""
                if code == "L":
                    inner = inner.split("|", 1)[0] if "|" in inner else inner.split("/", 1)[0] or inner
                return inner
            line = _POD_FMT.sub(repl, line)
        out.append(line.rstrip())
    return "\n".join(out)


class _HTMLText(html.parser.HTMLParser):
    BLOCK = {"p", "div", "br", "li", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "tr", "table", "dt", "dd", "title"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts, self.skip = [], 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self.skip += 1
        if tag in self.BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self.skip = max(0, self.skip - 1)
        if tag in self.BLOCK:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data)


def html_to_text(src):
    p = _HTMLText()
    p.feed(src)
    text = "".join(p.parts)
    return "\n".join(re.sub(r"[ \t]+", " ", ln).strip() for ln in text.split("\n"))


def normalise(text):
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\t", "    ")
    text = "".join(ch for ch in text if ch == "\n" or ch >= " " or ch == "\t")
    text = "\n".join(ln.rstrip() for ln in text.split("\n"))
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip() + "\n"


def chunk_paragraphs(name, text, size=CHUNK_CHARS):
    """Cut a long manual into ~size-character documents at blank lines."""
    docs, cur, n, k = [], [], 0, 0
    for para in text.split("\n\n"):
        cur.append(para)
        n += len(para) + 2
        if n >= size:
            docs.append((f"{name}#{k:04d}", "\n\n".join(cur)))
            cur, n, k = [], 0, k + 1
    if cur:
        docs.append((f"{name}#{k:04d}", "\n\n".join(cur)))
    return docs


def read_text(path):
    if path.endswith(".gz"):
        with gzip.open(path, "rb") as f:
            raw = f.read()
    else:
        with open(path, "rb") as f:
            raw = f.read()
    return raw.decode("utf-8", errors="replace")


# --------------------------------------------------------------------------------------------
# Per-package document extraction; each returns a sorted list of (name, text)
# --------------------------------------------------------------------------------------------


def docs_bible(root, roots):
    reader = os.path.join(roots["bible-kjv"], "usr/bin/bible")
    data = os.path.join(root, "usr/lib/bible.data")
    # the reader exits with status 255 even after printing every verse: check the text instead
    # (it only opens a data file named relative to the working folder)
    out = subprocess.run([reader, "-f", "-d", os.path.basename(data), "Gen1:1-Rev22:21"], capture_output=True,
                         cwd=os.path.dirname(data), stdin=subprocess.DEVNULL).stdout
    if b"Rev22:21 The grace of our Lord" not in out:
        sys.exit("bible-kjv: could not decode the whole Bible from bible.data")
    chapters = {}
    order = []
    for line in out.decode("utf-8", errors="replace").split("\n"):
        m = re.match(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$", line)
        if not m:
            continue
        book, ch, text = m.group(1), int(m.group(2)), m.group(4)
        key = (book, ch)
        if key not in chapters:
            chapters[key] = []
            order.append(key)
        chapters[key].append(text.strip())
    docs = []
    for i, key in enumerate(order):
        docs.append((f"{i:04d}_{key[0]}_{key[1]:03d}", "\n".join(chapters[key])))
    return docs


def docs_rst_sources(root, pattern, exclude=()):
    files = sorted(glob.glob(os.path.join(root, pattern), recursive=True))
    docs = []
    for f in files:
        rel = os.path.relpath(f, root)
        if any(x in rel for x in exclude):
            continue
        docs.append((rel, clean_rst(read_text(f))))
    return docs


def docs_perl(root, roots):
    files = sorted(glob.glob(os.path.join(root, "usr/share/perl/*/pod/*.pod")))
    return [(os.path.relpath(f, root), clean_pod(read_text(f))) for f in files]


def docs_single(root, relpaths, to_text=None):
    docs = []
    for rel in relpaths:
        text = read_text(os.path.join(root, rel))
        if to_text:
            text = to_text(text)
        docs.extend(chunk_paragraphs(rel, normalise(text)))
    return docs


def docs_debref(root, roots):
    files = sorted(glob.glob(os.path.join(root, "usr/share/debian-reference/*.en.html")))
    docs = []
    for f in files:
        docs.extend(chunk_paragraphs(os.path.relpath(f, root), normalise(html_to_text(read_text(f)))))
    return docs


EXTRACT = {
    "bible-kjv-text": docs_bible,
    "python3.11-doc": lambda r, rs: docs_rst_sources(r, "usr/share/doc/python3.11/html/_sources/**/*.rst.txt",
                                                     exclude=("whatsnew/changelog",)),
    "linux-doc-6.1": lambda r, rs: docs_rst_sources(r, "usr/share/doc/linux-doc-6.1/html/_sources/**/*.rst.txt",
                                                    exclude=("/translations/",)),
    "perl-doc": docs_perl,
    "jargon-text": lambda r, rs: docs_single(r, ["usr/share/doc/jargon-text/jargon.txt.gz"]),
    "gnu-standards": lambda r, rs: docs_single(
        r, ["usr/share/doc/gnu-standards/standards.text.gz", "usr/share/doc/gnu-standards/maintain.text.gz"]),
    "debian-reference-en": docs_debref,
}

# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------


def is_val(src, name):
    h = hashlib.sha256(f"{src}/{name}".encode()).digest()
    return int.from_bytes(h[:4], "little") % 1000 < VAL_PER_MILLE


def fetch_debs(debdir):
    names = [f"{p}={v}" for p, v, _ in PACKAGES]
    subprocess.run(["apt-get", "download", *names], cwd=debdir, check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.normpath(os.path.join(here, "..", "..", ".train-data")))
    ap.add_argument("--debs", help="folder that already holds the .deb files (skips apt-get download)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    with tempfile.TemporaryDirectory() as tmp:
        debdir = args.debs
        if not debdir:
            debdir = os.path.join(tmp, "debs")
            os.makedirs(debdir)
            fetch_debs(debdir)
        roots, manifest = {}, {"packages": [], "val_per_mille": VAL_PER_MILLE, "min_doc_chars": MIN_DOC_CHARS}
        for pkg, ver, lic in PACKAGES:
            deb = sorted(glob.glob(os.path.join(debdir, f"{pkg}_*.deb")))
            deb = [d for d in deb if os.path.basename(d).split("_")[1].replace("%3a", ":").split(":")[-1] == ver]
            if len(deb) != 1:
                sys.exit(f"{pkg}: expected one {pkg}_{ver}_*.deb in {debdir}, found {len(deb)}")
            roots[pkg] = os.path.join(tmp, "x", pkg)
            os.makedirs(roots[pkg])
            subprocess.run(["dpkg", "-x", deb[0], roots[pkg]], check=True)
            with open(deb[0], "rb") as f:
                deb_sha = hashlib.sha256(f.read()).hexdigest()
            manifest["packages"].append({"package": pkg, "version": ver, "licence": lic, "deb_sha256": deb_sha})

        train, val, stats = [], [], {}
        for pkg, _, _ in PACKAGES:
            if pkg not in EXTRACT:
                continue
            docs = EXTRACT[pkg](roots[pkg], roots)
            st = stats.setdefault(pkg, {"docs": 0, "chars": 0, "val_docs": 0, "val_chars": 0})
            for name, text in sorted(docs):
                text = normalise(text)
                if len(text) < MIN_DOC_CHARS:
                    continue
                rec = {"src": pkg, "name": name, "text": text}
                if is_val(pkg, name):
                    val.append(rec)
                    st["val_docs"] += 1
                    st["val_chars"] += len(text)
                else:
                    train.append(rec)
                    st["docs"] += 1
                    st["chars"] += len(text)
            print(f"{pkg:22s} train {st['docs']:6d} docs {st['chars'] / 1e6:7.2f} MB chars   "
                  f"val {st['val_docs']:4d} docs {st['val_chars'] / 1e6:5.2f} MB", flush=True)

    manifest["stats"] = stats
    for split, recs in (("train", train), ("val", val)):
        path = os.path.join(args.out, f"{split}.jsonl.xz")
        data = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in recs).encode()
        with open(path, "wb") as f:
            # no timestamps in the xz container; preset fixed -> identical bytes on rerun
            f.write(lzma.compress(data, preset=6))
        manifest[split] = {"docs": len(recs), "bytes_utf8": len(data), "sha256_uncompressed": hashlib.sha256(data).hexdigest(),
                           "file": os.path.basename(path), "file_bytes": os.path.getsize(path)}
        print(f"{split}: {len(recs)} docs, {len(data) / 1e6:.2f} MB -> {path} ({os.path.getsize(path) / 1e6:.2f} MB)")
    with open(os.path.join(args.out, "corpus_manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
