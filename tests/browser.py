"""Opening a page in headless Chromium for the HTML report tests (show, reproduce all)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")  # Debian's package installs /usr/bin/chromium
SKIP_REASON = "headless Chromium not installed (Debian: apt-get install chromium); html.parser checks still run"


def dump_dom(page: Path, profile: Path) -> subprocess.CompletedProcess:
    """Loads ``page`` in headless Chromium (its scripts run) and returns the finished process:
    stdout holds the DOM after the scripts, stderr the console lines (":CONSOLE")."""
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--enable-logging=stderr", "--v=0",
           f"--user-data-dir={profile}", "--virtual-time-budget=10000", "--dump-dom", Path(page).resolve().as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def console_lines(r: subprocess.CompletedProcess) -> list[str]:
    """The page's errors and console output in Chromium's log."""
    return [line for line in r.stderr.splitlines() if ":CONSOLE" in line]
