"""Every link and anchor of the documentation resolves: the markdown as a repository host shows it, and the
built site (the guide from mkdocs, the API reference from pdoc).

    python scripts/check_links.py                    # README.md, CHANGELOG.md and docs/**/*.md
    python scripts/check_links.py --site build/site  # and every href/src of the built HTML

Markdown: a relative link names an existing file or folder; an anchor names a heading of the target page
under both slug rules that render it (the repository host's and the site's), or an explicit ``id``; a page
under docs/ links only to files inside docs/ (the site holds nothing else and no folder pages; name source
files and folders in code spans). Site:
every relative ``href``/``src`` of every HTML page names a file of the site, and its ``#fragment`` an ``id``
of that file. Exits 1 with one line per broken link, 0 when there is none. Reads only; writes nothing.
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
import unicodedata
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {"multi30k-outputs"}  # blind translations: data files, no markdown links
FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
EXPLICIT_ID = re.compile(r"""<a\s+(?:id|name)=["']([^"']+)["']""")


def markdown_files(root: Path = ROOT) -> list[Path]:
    """README.md, CHANGELOG.md and every markdown file under docs/ (data folders left out)."""
    files = [root / name for name in ("README.md", "CHANGELOG.md") if (root / name).is_file()]
    files += sorted(p for p in (root / "docs").rglob("*.md") if not SKIP_DIRS & set(p.relative_to(root / "docs").parts))
    return files


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, inline code spans blanked."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, re.sub(r"`[^`]*`", lambda m: "`" + "x" * (len(m.group(0)) - 2) + "`", line)))
    return out


def heading_text(raw: str) -> str:
    """A heading as rendered: links reduced to their text, emphasis and code marks dropped, tags removed."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    text = re.sub(r"<[^>]+>", "", text)
    return text.replace("`", "").replace("**", "").replace("*", "")


def github_slug(text: str) -> str:
    """The repository host's anchor of a heading: lower case, punctuation dropped, each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading_text(text).strip().lower()).replace(" ", "-")


def site_slug(text: str) -> str:
    """The site's anchor (Python-Markdown's ``toc`` slugify): ASCII, punctuation dropped, runs of spaces and
    hyphens one hyphen."""
    value = unicodedata.normalize("NFKD", heading_text(text)).encode("ascii", "ignore").decode("ascii")
    value = re.sub(r"[^\w\s-]", "", value).strip().lower()
    return re.sub(r"[-\s]+", "-", value)


def anchors(path: Path) -> tuple[set[str], set[str]]:
    """The anchors of a markdown page under each rule: (repository host's, site's), explicit ids in both."""
    host, site, explicit = set(), set(), set()
    seen_host: dict[str, int] = {}
    seen_site: dict[str, int] = {}
    text = path.read_text(encoding="utf-8")
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if fenced:
            continue
        explicit.update(EXPLICIT_ID.findall(line))
        m = HEADING.match(line)
        if not m:
            continue
        for slug, seen, found, sep in (
            (github_slug(m[2]), seen_host, host, "-"),
            (site_slug(m[2]), seen_site, site, "_"),
        ):
            k = seen.get(slug, 0)
            found.add(slug if k == 0 else f"{slug}{sep}{k}")
            seen[slug] = k + 1
    return host | explicit, site | explicit


def check_markdown(files: list[Path], root: Path = ROOT) -> list[str]:
    """One line per broken link of ``files``: a missing target, a missing anchor, or a docs page leaving docs/."""
    problems: list[str] = []
    cache: dict[Path, tuple[set[str], set[str]]] = {}
    docs = (root / "docs").resolve()
    for path in files:
        rel = path.relative_to(root).as_posix()
        in_docs = path.resolve().is_relative_to(docs)
        for number, line in prose_lines(path.read_text(encoding="utf-8")):
            for target in LINK.findall(line):
                parts = urlsplit(target)
                if parts.scheme or target.startswith("//"):
                    continue  # an external URL
                where = f"{rel}:{number}: {target}"
                dest = (path.parent / unquote(parts.path)).resolve() if parts.path else path.resolve()
                if not dest.exists():
                    problems.append(f"{where}: no such file or folder")
                    continue
                if in_docs and not dest.is_relative_to(docs):
                    problems.append(f"{where}: a guide page links outside docs/ (name the file in a code span)")
                    continue
                if in_docs and dest.is_dir():
                    problems.append(f"{where}: a guide page links to a folder (the site has no page there)")
                    continue
                if parts.fragment:
                    if dest.suffix != ".md":
                        problems.append(f"{where}: an anchor into a file that is not a markdown page")
                        continue
                    host, site = cache.setdefault(dest, anchors(dest))
                    fragment = unquote(parts.fragment)
                    if fragment not in host or fragment not in site:
                        missing = " and ".join(
                            n for n, s in (("the repository view", host), ("the site", site)) if fragment not in s
                        )
                        problems.append(f"{where}: no heading with this anchor in {missing}")
    return problems


class _Refs(HTMLParser):
    """The ids of an HTML page and the hrefs/srcs it links to."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.refs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name in ("id", "name") and (name == "id" or tag == "a"):
                self.ids.add(value)
            elif (name == "href" and tag in ("a", "link", "area")) or (name == "src" and tag in ("img", "script")):
                self.refs.append(value)


def _parse(path: Path) -> _Refs:
    parser = _Refs()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    return parser


def inherited_from_outside(page: Path, site: Path, fragment: str) -> bool:
    """True when ``fragment`` (``Class.member``) on an API page names a member that the class inherits from a
    base outside this project (``torch.nn.Module.parameters``): pdoc links such names in docstrings but does not
    render members of undocumented external classes, so there is no target to check."""
    import importlib

    rel = page.relative_to(site)
    if rel.parts[0] != "api" or "." not in fragment:
        return False
    module_name = ".".join(rel.with_suffix("").parts[1:])
    owner_name, _, member = fragment.rpartition(".")
    try:
        owner: object = importlib.import_module(module_name)
        for part in owner_name.split("."):
            owner = getattr(owner, part)
    except (ImportError, AttributeError):
        return False
    if not isinstance(owner, type):
        return False
    ours = [c for c in owner.__mro__ if c.__module__.split(".")[0] in ("bertscore_loss", "rerank")]
    if any(member in vars(c) for c in ours):
        return False  # our own member: pdoc renders it, so the anchor must exist
    for base in owner.__mro__:
        if base in ours or base is object:
            continue
        if member in vars(base):
            return True
        init = vars(base).get("__init__")  # an attribute the external base sets on instances
        try:
            if init is not None and f"self.{member} " in inspect.getsource(init):
                return True
        except (OSError, TypeError):
            continue
    return False


def check_site(site: Path) -> list[str]:
    """One line per broken relative link or anchor among the HTML pages of a built site."""
    site = site.resolve()
    pages = sorted(site.rglob("*.html"))
    if not pages:
        return [f"{site}: no HTML pages (build the site first: scripts/build_docs.sh)"]
    parsed = {p: _parse(p) for p in pages}
    problems: list[str] = []
    for page, refs in parsed.items():
        for ref in refs.refs:
            parts = urlsplit(ref)
            if parts.scheme or ref.startswith(("//", "javascript:")):
                continue
            where = f"{page.relative_to(site)}: {ref}"
            base = site if parts.path.startswith("/") else page.parent  # root-relative (mkdocs' 404 page)
            dest = (base / unquote(parts.path.lstrip("/"))).resolve() if parts.path else page
            if dest.is_dir():
                dest = dest / "index.html"
            if not dest.exists():
                problems.append(f"{where}: no such file in the site")
            elif not dest.is_relative_to(site):
                problems.append(f"{where}: outside the site")
            elif parts.fragment and dest.suffix == ".html":
                ids = parsed[dest].ids if dest in parsed else _parse(dest).ids
                fragment = unquote(parts.fragment)
                if fragment not in ids and not inherited_from_outside(dest, site, fragment):
                    problems.append(f"{where}: no element with this id")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--site", type=Path, help="a built site to check too (scripts/build_docs.sh: build/site)")
    args = ap.parse_args(argv)
    files = markdown_files()
    problems = check_markdown(files)
    pages = 0
    if args.site:
        problems += check_site(args.site)
        pages = len(list(args.site.rglob("*.html")))
    for line in problems:
        print(f"broken link: {line}", file=sys.stderr)
    if problems:
        return 1
    print(f"links: {len(files)} markdown files" + (f" and {pages} HTML pages" if args.site else "") + " checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
