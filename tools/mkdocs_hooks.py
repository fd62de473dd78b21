"""mkdocs hooks of the docs site (``hooks:`` in mkdocs.yml).

The docstrings name other objects with Sphinx roles (``:class:`CacheGuard```,
``:meth:`~cacheguard.CacheGuard.write```), which Markdown renders as the role's
text followed by code. On the API reference page each becomes code, linked to the
object's heading when the page documents exactly one object of that name (``~``
keeps only the last part of a dotted name, and ``title <target>`` shows the title,
as in Sphinx). A paragraph ending in reST's ``::`` (a code block follows) ends in
``:``, and a paragraph of ``::`` alone goes, as Sphinx renders them.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(
    r":(?:class|func|meth|mod|data|attr|exc|obj):"
    r"<code>(~?)(?:([^<]*?) &lt;)?([\w.]+)(?:&gt;)?</code>"
)
_HEADING_ID = re.compile(r'<h\d id="(cacheguard[\w.]*)"')


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri != "api.md":  # the docstrings are there
        return html
    headings = _HEADING_ID.findall(html)

    def code(match: re.Match[str]) -> str:
        short, title, name = match.group(1), match.group(2), match.group(3)
        shown = title or (name.rsplit(".", 1)[-1] if short else name)
        found = [h for h in headings if h == name or h.endswith(f".{name}")]
        if len(set(found)) == 1:
            return f'<a href="#{found[0]}"><code>{shown}</code></a>'
        return f"<code>{shown}</code>"

    html = _ROLE.sub(code, html)
    return html.replace("<p>::</p>", "").replace("::</p>", ":</p>")
