"""mkdocs hooks: benchmarks/README.md, where the measured figures live, and its pictures become
pages of the site without a copy; pages link to it as `../benchmarks/...`, right on GitHub too."""

from __future__ import annotations

from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    shared = [BENCHMARKS / "README.md", *sorted((BENCHMARKS / "results").glob("*.png"))]
    for path in shared:
        uri = path.relative_to(ROOT).as_posix()
        files.append(File(uri, str(ROOT), config.site_dir, config.use_directory_urls))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    # Every page sits at the top of docs/, so `../benchmarks/` there is `benchmarks/` in the site.
    return markdown.replace("](../benchmarks/", "](benchmarks/")
