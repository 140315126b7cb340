import subprocess
import sys
from pathlib import Path

import pytest

import mirage as mi
from mirage import config
from mirage.cli import main
from mirage.frontend import optimize

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MIRAGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MIRAGE_NO_PROGRESS", "1")
    return tmp_path / "cache"


@pytest.fixture
def quick_search(monkeypatch):
    calls = []

    def run_search(reference, settings, progress=True):
        calls.append(settings)
        return reference, "1 verified µGraph(s); search stopped: test", [reference], False

    monkeypatch.setattr(optimize, "run_search", run_search)
    return calls


def test_python_dash_m_help():
    result = subprocess.run([sys.executable, "-m", "mirage", "--help"], cwd=ROOT, capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0
    for command in ("demo", "search", "show", "draw", "partition", "ops", "cache"):
        assert command in result.stdout


def test_show(graph_file, capsys):
    assert main(["show", str(graph_file)]) == 0
    out = capsys.readouterr().out
    assert 'kernel_graph "small"' in out and "exp(" in out
    assert f"content hash {mi.load(graph_file).content_hash()}" in out


def test_draw(graph_file, tmp_path):
    assert main(["draw", str(graph_file), "-o", str(tmp_path / "g.dot")]) == 0
    assert (tmp_path / "g.dot").read_text().startswith("digraph")


def test_search_a_saved_graph(graph_file, tmp_path, quick_search, capsys):
    out_file = tmp_path / "best.json"
    assert main(["search", str(graph_file), "--time-limit", "5", "--config", "mlp", "-o", str(out_file)]) == 0
    assert "µGraph from search" in capsys.readouterr().out
    assert mi.load(out_file) == mi.load(graph_file)
    (settings,) = quick_search
    assert (settings.config, settings.time_limit_s) == ("mlp", 5.0)


def test_search_a_program_factory(tmp_path, quick_search, capsys):
    (tmp_path / "models.py").write_text(
        "import torch\n"
        "def make():\n"
        "    return (lambda x, w: torch.relu(x @ w)), (torch.randn(3, 4), torch.randn(4, 5))\n")
    assert main(["search", f"{tmp_path / 'models.py'}:make"]) == 0
    out = capsys.readouterr().out
    assert "1 subprogram(s) covering 2 torch op(s)" in out and "µGraph from search" in out
    assert len(quick_search) == 1


def test_partition_of_an_example(tmp_path, capsys):
    assert main(["partition", "mirage.frontend.examples:gqa_decode", "-o", str(tmp_path / "p.dot")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("partition: 3 subprogram(s)")
    assert "online softmax" in out
    assert "cluster_sp1" in (tmp_path / "p.dot").read_text()


@pytest.mark.parametrize(("argv", "message"), [
    (["show", "missing.json"], "no such graph file: missing.json"),
    (["partition", "no_colon"], "is not PATH.py:FACTORY or MODULE:FACTORY"),
    (["partition", "mirage.frontend.examples:nothing"], "has no 'nothing'"),
    (["partition", "surely_not_a_module:make"], "cannot import module 'surely_not_a_module'"),
    (["draw", "missing.json", "-o", "out.png"], "no such graph file: missing.json"),
])
def test_errors_exit_with_status_2(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.fixture
def factories(tmp_path):
    path = tmp_path / "factories.py"
    path.write_text(
        "import torch\n"
        "import mirage\n"
        "notcallable = 3\n"
        "def needs_arg(n):\n"
        "    return None\n"
        "def graph():\n"
        "    g = mirage.new_kernel_graph('small')\n"
        "    x = g.new_input(dims=(4, 8), dtype=mirage.float32)\n"
        "    w = g.new_input(dims=(8, 16), dtype=mirage.float32)\n"
        "    g.mark_output(g.relu(g.matmul(x, w)))\n"
        "    return g\n"
        "def make():\n"
        "    return (lambda x, w: torch.relu(x @ w)), (torch.randn(3, 4), torch.randn(4, 5))\n"
        "def gqa():\n"
        "    from mirage.frontend.examples import gqa_decode\n"
        "    return gqa_decode()\n")
    return path


@pytest.mark.parametrize(("argv", "message"), [
    (["partition", "{factories}:notcallable"], "is a value of type int, not a function: name a factory"),
    (["partition", "{factories}:needs_arg"], "cannot be called without arguments"),
    (["search", "{factories}:needs_arg"], "name a factory that takes no arguments, or wrap this one"),
    (["partition", "mirage.frontend.examples:gqa_decode", "--max-ops", "0"],
     "--max-ops must be a positive number of kernel-graph ops per subprogram, got 0"),
    (["partition", "mirage.frontend.examples:gqa_decode", "--max-ops", "-3"], "got -3"),
    (["demo", "--scale", "0", "--no-search"], "scale must be a positive integer"),
    (["demo", "--scale", "-1", "--no-search"], "scale must be a positive integer"),
    (["demo", "--config", "no_such_config", "--no-search"], "unknown search config 'no_such_config'"),
    (["demo", "--time-limit", "nan", "--no-search"],
     "--time-limit must be a finite positive number of seconds (such as 30), got nan"),
    (["search", "{graph_file}", "--time-limit", "inf"], "--time-limit must be a finite positive number"),
    (["search", "{factories}:make", "--time-limit", "-1"], "of seconds (such as 30), got -1"),
    (["search", "{graph_file}", "-o", "{tmp_path}/missing/best.json"], "its folder"),  # before searching
    (["draw", "{graph_file}", "-o", "{tmp_path}/g.xyz"], "unknown format 'xyz'; name a file ending in .dot"),
    (["cache", "list", "--dir", "{graph_file}"], "is a file, not a cache folder"),
    (["cache", "clear", "--dir", "{tmp_path}/no_such_dir"], "no cache folder"),
])
def test_bad_arguments_are_one_line_errors(argv, message, factories, graph_file, tmp_path, capsys):
    argv = [a.format(factories=factories, graph_file=graph_file, tmp_path=tmp_path) for a in argv]
    if argv[0] == "demo":
        argv += ["--output-dir", str(tmp_path / "demo")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mirage {argv[0]}: error: ") and message in err and err.count("\n") == 1
    assert "Traceback" not in err
    assert not (tmp_path / "demo").exists()


def test_show_a_file_that_is_not_text(tmp_path, capsys):
    path = tmp_path / "random.json"
    path.write_bytes(bytes([0x7B, 0x22, 0xC3, 0x28, 0xFF, 0xFE]) * 20)
    for command in (["show", str(path)], ["draw", str(path), "-o", str(tmp_path / "g.dot")]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert err == (f"mirage {command[0]}: error: {path} is not a saved graph: it is not UTF-8 text "
                       "(byte 2: invalid continuation byte); pass a file written by g.to_json(path)\n")


def test_search_a_graph_factory_saves_the_graph(factories, tmp_path, quick_search, capsys):
    out_file = tmp_path / "best.json"
    assert main(["search", f"{factories}:graph", "-o", str(out_file)]) == 0
    assert f"saved {out_file}" in capsys.readouterr().out
    assert mi.load(out_file).name == "small"


def test_search_a_program_saves_each_subprogram_graph(factories, tmp_path, quick_search, capsys):
    out_file = tmp_path / "best.json"
    assert main(["search", f"{factories}:make", "-o", str(out_file)]) == 0
    assert f"saved {out_file}" in capsys.readouterr().out
    assert mi.load(out_file).outputs
    assert main(["search", f"{factories}:gqa", "--no-cache", "-o", str(out_file.with_name("gqa.json"))]) == 0
    out = capsys.readouterr().out
    saved = sorted(p.name for p in tmp_path.glob("gqa*.json"))
    assert saved == ["gqa.sp0.json", "gqa.sp1.json", "gqa.sp2.json"]
    for name in saved:
        assert f"saved {tmp_path / name}" in out
        mi.load(tmp_path / name)


def test_draw_extension_in_any_case(graph_file, tmp_path, capsys):
    assert main(["draw", str(graph_file), "-o", str(tmp_path / "g.DOT")]) == 0
    assert (tmp_path / "g.DOT").read_text().startswith("digraph")
    assert main(["partition", "mirage.frontend.examples:gqa_decode", "-o", str(tmp_path / "p.Dot")]) == 0
    assert "cluster_sp1" in (tmp_path / "p.Dot").read_text()


def test_demo_passes_its_config_on(tmp_path, monkeypatch, capsys):
    import mirage.frontend.demo as demo

    seen = []
    real = mi.superoptimize

    def superoptimize(*args, **options):
        seen.append(options.get("config"))
        return real(*args, **options)

    monkeypatch.setattr(mi, "superoptimize", superoptimize)
    monkeypatch.setattr(demo.torch.cuda, "is_available", lambda: False)
    assert main(["demo", "--no-search", "--config", "mlp", "--output-dir", str(tmp_path / "demo")]) == 0
    assert seen == ["mlp"]


def test_unwritable_output_is_a_clean_error(graph_file, tmp_path, capsys):
    assert main(["draw", str(graph_file), "-o", str(tmp_path / "missing-dir" / "g.dot")]) == 2
    assert "No such file or directory" in capsys.readouterr().err


def test_cache_list_and_clear(graph_file, quick_search, isolated_cache, capsys):
    assert main(["search", str(graph_file)]) == 0
    capsys.readouterr()
    assert main(["cache", "list"]) == 0
    listing = capsys.readouterr().out
    assert listing.startswith(f"1 entries in {isolated_cache / 'search'}") and "small" in listing
    assert main(["cache", "clear"]) == 0
    assert "removed 1 cached item(s)" in capsys.readouterr().out
    assert not list((isolated_cache / "search").glob("*.json"))


def test_demo_without_search(tmp_path, capsys):
    assert main(["demo", "--no-search", "--output-dir", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out
    assert "partition  1 subprogram(s) covering 2 torch op(s)" in out
    assert "float check against eager PyTorch" in out and "(pass)" in out


def test_config_reads_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("MIRAGE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert config.settings().cache_dir == tmp_path / "xdg" / "mirage"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert config.settings().cache_dir == Path.home() / ".cache" / "mirage"
    monkeypatch.setenv("MIRAGE_EXECUTOR", "tpu")
    with pytest.raises(config.ConfigError, match="MIRAGE_EXECUTOR='tpu'"):
        config.settings()
    monkeypatch.setenv("MIRAGE_EXECUTOR", "interpret")
    monkeypatch.setenv("MIRAGE_NO_CACHE", "maybe")
    with pytest.raises(config.ConfigError, match="not a yes/no value"):
        config.settings()
    monkeypatch.setenv("MIRAGE_NO_CACHE", "1")
    settings = config.settings()
    assert (settings.executor, settings.use_cache, settings.progress) == ("interpret", False, False)


def test_ops_lists_what_lowers_and_says_when_nothing_matches(capsys):
    assert main(["ops"]) == 0
    out = capsys.readouterr().out
    for name in ("softmax", "scaled_dot_product_attention", "softplus", "batch_norm", "einsum"):
        assert any(line.split()[0] == name for line in out.splitlines()), name
    assert "rewritten at capture" in out.splitlines()[-1]
    assert main(["ops", "norm"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()[:-1]]
    assert names and all("norm" in name for name in names) and "rms_norm" in names
    assert main(["ops", "cumsum"]) == 2
    assert "runs in PyTorch" in capsys.readouterr().err
