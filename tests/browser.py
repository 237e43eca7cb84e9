"""Opening a page in headless Chromium for the HTML report tests (seqmix show --html, reproduce all,
linearize's report.html): its DOM after the scripts ran, the natural width of every image, a
screenshot, and whether that screenshot is blank."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")  # Debian's package installs /usr/bin/chromium
SKIP_REASON = "headless Chromium not installed (Debian: apt-get install chromium); html.parser checks still run"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars"]
#: the probe appended to a copy of a page: once the page has loaded, every <img>'s natural width
#: (0 for an image that did not decode) in the body's data-natural-widths attribute
PROBE = ("<script>window.addEventListener('load', () => { document.body.dataset.naturalWidths = "
         "JSON.stringify(Array.from(document.images, i => i.complete ? i.naturalWidth : 0)); });</script>")


def dump_dom(page: Path, profile: Path) -> subprocess.CompletedProcess:
    """Loads ``page`` in headless Chromium (its scripts run) and returns the finished process:
    stdout holds the DOM after the scripts, stderr the console lines (":CONSOLE")."""
    cmd = [CHROMIUM, *FLAGS, "--enable-logging=stderr", "--v=0", f"--user-data-dir={profile}", "--virtual-time-budget=10000",
           "--dump-dom", Path(page).resolve().as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def console_lines(r: subprocess.CompletedProcess) -> list[str]:
    """The page's errors and console output in Chromium's log."""
    return [line for line in r.stderr.splitlines() if ":CONSOLE" in line]


def image_widths(page: Path, profile: Path) -> list[int]:
    """The natural width of every image of ``page`` as Chromium decoded it (0: not loaded), read by
    :data:`PROBE` in a copy of the page beside it (so relative links resolve the same)."""
    page = Path(page)
    text = page.read_text(encoding="utf-8")
    probe = page.with_name(f".probe-{page.name}")
    at = text.rfind("</body>")
    probe.write_text(text[:at] + PROBE + text[at:] if at >= 0 else text + PROBE, encoding="utf-8")
    try:
        r = dump_dom(probe, profile)
    finally:
        probe.unlink()
    assert r.returncode == 0, r.stderr[-2000:]
    m = re.search(r'data-natural-widths="([^"]*)"', r.stdout)
    assert m, f"the probe did not run: {r.stdout[:300]}"
    return json.loads(m.group(1).replace("&quot;", '"'))


def screenshot(page: Path, out: Path, profile: Path, size: tuple[int, int] = (1200, 1600)) -> Path:
    """A PNG of ``page`` as headless Chromium draws it at ``size`` (width, height) pixels."""
    cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=10000", f"--window-size={size[0]},{size[1]}",
           f"--screenshot={Path(out).resolve()}", Path(page).resolve().as_uri()]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and Path(out).is_file(), r.stderr[-2000:]
    return Path(out)


def ink(png: Path) -> float:
    """The fraction of a picture's pixels that differ from its most common colour (0: blank)."""
    import numpy as np
    from PIL import Image

    px = np.asarray(Image.open(png).convert("RGB")).reshape(-1, 3)
    _, counts = np.unique(px, axis=0, return_counts=True)
    return 1.0 - counts.max() / len(px)


def check_in_browser(page: Path, tmp: Path, n_images: int, min_ink: float = 0.02) -> list[int]:
    """Opens ``page`` in headless Chromium: exactly ``n_images`` images, each decoded (natural width > 0),
    and a screenshot with more than ``min_ink`` of its pixels off the background. Returns the widths."""
    widths = image_widths(page, tmp / "profile")
    assert len(widths) == n_images and all(w > 0 for w in widths), widths
    shot = screenshot(page, tmp / "shot.png", tmp / "profile")
    assert ink(shot) > min_ink, f"the screenshot of {page} is blank ({ink(shot):.4f} of its pixels drawn)"
    return widths
