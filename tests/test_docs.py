"""The docs hold together: the site under docs/ builds with `mkdocs build --strict` (a broken link or anchor, a page
missing from the nav or a nav entry without a page fails it), and every relative link in README.md and in the
benchmark journal (bench/results/JOURNAL.md), which the site does not build, names a file that exists."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
# Markdown links and images, [text](target) or [text](target "title"); a target in <...> may hold spaces.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*(<[^>]+>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(\S+)", re.M)


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """`mkdocs build --strict` of `config` into `site`, as a reader of its output would see it."""
    env = os.environ | {"NO_MKDOCS_2_WARNING": "1", "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        cwd=config.parent,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def relative_links(markdown: str) -> list[str]:
    """The relative link targets of a Markdown text, without their #anchors; code blocks and code spans hold none."""
    text = re.sub(r"(?ms)^\s*```.*?^\s*```", "", markdown)
    text = re.sub(r"`[^`\n]*`", "", text)
    targets = [m.strip("<>") for m in LINK.findall(text)] + REFERENCE.findall(text)
    out = []
    for target in targets:
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith(("#", "/")):
            continue  # another site, mail, an anchor in the same page, or a site-absolute path
        out.append(target.split("#", 1)[0])
    return out


def test_the_docs_build_strict(tmp_path: Path):
    done = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    assert (tmp_path / "site" / "index.html").is_file()


def test_the_site_config_turns_every_link_and_nav_problem_into_a_failure():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["strict"] is True and config["theme"]["name"] == "material"
    validation = config["validation"]
    assert validation["nav"] == {"omitted_files": "warn", "not_found": "warn", "absolute_links": "warn"}
    assert validation["links"] == {
        "not_found": "warn",
        "anchors": "warn",
        "absolute_links": "warn",
        "unrecognized_links": "warn",
    }


def test_a_broken_link_or_a_page_missing_from_the_nav_fails_the_build(tmp_path: Path):
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    with (copy / "docs" / "index.md").open("a") as page:
        page.write("\nSee [the lost page](operations/no-such-page.md).\n")
    broken = build(copy / "mkdocs.yml", tmp_path / "site")
    assert broken.returncode != 0
    assert "no-such-page.md" in broken.stdout + broken.stderr

    shutil.copy(ROOT / "docs" / "index.md", copy / "docs" / "index.md")
    (copy / "docs" / "orphan.md").write_text("# A page no one lists\n")
    orphan = build(copy / "mkdocs.yml", tmp_path / "site")
    assert orphan.returncode != 0
    assert "orphan.md" in orphan.stdout + orphan.stderr


def test_every_relative_link_in_the_readme_and_the_benchmark_journal_names_a_file():
    for doc in (ROOT / "README.md", ROOT / "bench" / "results" / "JOURNAL.md"):
        links = relative_links(doc.read_text())
        assert links, f"{doc.name} links to nothing"
        missing = [t for t in links if not (doc.parent / t).is_file()]
        assert missing == [], f"{doc.relative_to(ROOT)} links to files that do not exist: {missing}"


def test_the_readme_links_into_the_docs_and_to_the_journal():
    links = set(relative_links((ROOT / "README.md").read_text()))
    assert "bench/results/JOURNAL.md" in links
    assert {"docs/operations/dr.md", "docs/deploy/stacks.md", "docs/decisions/index.md"} <= links


def test_relative_links_finds_links_and_skips_code_and_other_sites():
    text = (
        "[a](docs/a.md) ![b](img/b.png) [c](docs/c.md#part) [d](https://example.org/d.md) [e](#here)\n"
        "`[f](f.md)`\n```\n[g](g.md)\n```\n[h]: docs/h.md\n"
    )
    assert relative_links(text) == ["docs/a.md", "img/b.png", "docs/c.md", "docs/h.md"]
