"""Reading the pixels of a browser test's screenshot, decoded by the browser itself.

    assert_background_reaches_the_bottom(page, png)   # a full-page screenshot of ``page``
    width, height = png_size(png)
    rows = bottom_rows(context, png, 8)     # the last 8 rows, each a list of (r, g, b)

The tests have no image library: Chromium's own PNG decoder and a canvas read
the pixels, in a blank page of the test's browser context (no network).
"""

from __future__ import annotations

import base64
import re
import struct

from playwright.sync_api import BrowserContext, Page

Colour = tuple[int, int, int]

_READ_BOTTOM = """async ([url, rows]) => {
  const image = new Image();
  image.src = url;
  await image.decode();
  const canvas = document.createElement("canvas");
  canvas.width = image.naturalWidth;
  canvas.height = image.naturalHeight;
  const drawing = canvas.getContext("2d");
  drawing.drawImage(image, 0, 0);
  const data = drawing.getImageData(0, canvas.height - rows, canvas.width, rows).data;
  const out = [];
  for (let y = 0; y < rows; y++) {
    const row = [];
    for (let x = 0; x < canvas.width; x++) {
      const i = (y * canvas.width + x) * 4;
      row.push([data[i], data[i + 1], data[i + 2]]);
    }
    out.push(row);
  }
  return out;
}"""


def assert_background_reaches_the_bottom(page: Page, png: bytes) -> None:
    """The full-page screenshot is as tall as the document, taller than the
    window, and its last rows are the sidebar's background, its border, then
    the body's background: no band below the sidebar that nothing paints."""
    facts = page.evaluate(
        """() => {
          const sidebar = getComputedStyle(document.querySelector(".sidebar"));
          return {
            sidebar: sidebar.backgroundColor, border: sidebar.borderRightColor,
            borderWidth: parseFloat(sidebar.borderRightWidth),
            width: document.querySelector(".sidebar").getBoundingClientRect().width,
            body: getComputedStyle(document.body).backgroundColor,
            height: document.documentElement.scrollHeight, window: innerHeight,
          };
        }"""
    )
    width, height = png_size(png)
    assert height == facts["height"] > facts["window"], facts
    sidebar, border = round(facts["width"] - facts["borderWidth"]), round(facts["width"])
    expected = [_rgb(facts["sidebar"])] * sidebar + [_rgb(facts["border"])] * (border - sidebar)
    expected += [_rgb(facts["body"])] * (width - border)
    for y, row in enumerate(bottom_rows(page.context, png, 8), start=height - 8):
        wrong = [x for x, colour in enumerate(row) if colour != expected[x]]
        assert not wrong, f"row {y}: x={wrong[0]}..{wrong[-1]} is {row[wrong[0]]}, expected {expected[wrong[0]]}"


def png_size(png: bytes) -> tuple[int, int]:
    """Width and height from the PNG's header (the IHDR chunk comes first)."""
    if png[:8] != b"\x89PNG\r\n\x1a\n" or png[12:16] != b"IHDR":
        raise ValueError("not a PNG")
    width, height = struct.unpack(">II", png[16:24])
    return width, height


def bottom_rows(context: BrowserContext, png: bytes, rows: int) -> list[list[Colour]]:
    """The last ``rows`` rows of pixels of ``png``, top to bottom, each pixel as (r, g, b)."""
    page = context.new_page()
    try:
        url = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
        decoded = page.evaluate(_READ_BOTTOM, [url, rows])
    finally:
        page.close()
    return [[(r, g, b) for r, g, b in row] for row in decoded]


def _rgb(css: str) -> Colour:
    r, g, b = (int(part) for part in re.findall(r"\d+", css)[:3])
    return r, g, b
