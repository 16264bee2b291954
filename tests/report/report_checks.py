"""Checks of a written report shared by the report tests: the HTML is well formed, every image
is an embedded data URI that decodes (SVG: well-formed XML), and the page needs no network."""

from __future__ import annotations

import base64
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class _Checker(HTMLParser):
    """Tag balance (every opened element closed, in order) and the attributes of the images."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, tuple[int, int]]] = []
        self.errors: list[str] = []
        self.images: list[dict[str, str | None]] = []
        self.tags: list[str] = []
        self.doctype = False

    def handle_decl(self, decl: str) -> None:
        self.doctype |= decl.lower() == "doctype html"

    def handle_starttag(self, tag, attrs) -> None:
        self.tags.append(tag)
        if tag == "img":
            self.images.append(dict(attrs))
        if tag not in VOID:
            self.stack.append((tag, self.getpos()))

    def handle_startendtag(self, tag, attrs) -> None:
        self.tags.append(tag)
        if tag == "img":
            self.images.append(dict(attrs))
        if tag not in VOID:
            self.errors.append(f"self-closed <{tag}/> at {self.getpos()}")

    def handle_endtag(self, tag) -> None:
        if tag in VOID:
            self.errors.append(f"end tag of void <{tag}> at {self.getpos()}")
        elif not self.stack or self.stack[-1][0] != tag:
            self.errors.append(f"</{tag}> at {self.getpos()} closes {self.stack[-1] if self.stack else 'nothing'}")
        else:
            self.stack.pop()


def check_html(text: str) -> list[bytes]:
    """Assert the report is well-formed, self-contained HTML; return the decoded images."""
    checker = _Checker()
    checker.feed(text)
    checker.close()
    assert checker.doctype, "no <!DOCTYPE html>"
    assert not checker.errors, checker.errors[:5]
    assert not checker.stack, f"unclosed elements: {checker.stack[:5]}"
    assert checker.tags[:1] == ["html"] and {"head", "title", "body"} <= set(checker.tags)
    assert "script" not in checker.tags and "link" not in checker.tags, "the report loads nothing"
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text), "a URL to fetch"
    images = []
    for image in checker.images:
        src = image.get("src") or ""
        assert image.get("alt"), f"image without alt text: {src[:60]}"
        match = re.fullmatch(r"data:(image/svg\+xml|image/png);base64,([A-Za-z0-9+/=]+)", src)
        assert match, f"not an embedded image: {src[:60]!r}"
        data = base64.b64decode(match[2], validate=True)
        assert data, "empty image"
        if match[1] == "image/svg+xml":
            root = ET.fromstring(data)  # raises on malformed XML
            assert root.tag.endswith("svg") and root.get("width") and root.get("height")
        else:
            assert data.startswith(b"\x89PNG\r\n\x1a\n")
        images.append(data)
    for svg in re.findall(r"<svg\b.*?</svg>", text, flags=re.S):  # inline SVG, if any
        ET.fromstring(svg)
    return images
