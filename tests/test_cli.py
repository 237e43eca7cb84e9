import subprocess
import sys

from seqmix.cli import main


def test_list_prints_every_mixer(capsys):
    import seqmix

    assert main(["list", "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    for e in seqmix.list_mixers():
        assert f"| {e.name} | {e.family} |" in out


def test_info_and_unknown_name(capsys):
    assert main(["info", "linear_attention"]) == 0
    assert "chunk_size" in capsys.readouterr().out
    assert main(["info", "no_such_mixer"]) == 2
    assert "unknown mixer 'no_such_mixer'" in capsys.readouterr().err


def test_python_dash_m_runs():
    r = subprocess.run([sys.executable, "-m", "seqmix", "list", "--format", "names"], capture_output=True, text=True)
    assert r.returncode == 0 and "linear_attention" in r.stdout
