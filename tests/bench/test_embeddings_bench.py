from bench.embeddings.__main__ import plan, plot
from ranking.config import ModelConfig


def test_plan_sweeps_every_method_and_ratio():
    runs = plan(ModelConfig(), (2, 10), (0.0, 0.02))
    tags = [(m, r) for m, r, _ in runs]
    assert tags == [
        ("full", "1"),
        ("amtl", "learned"),
        ("amtl", "pen0.02"),
        ("hashing", "2"),
        ("hashing", "10"),
        ("qr", "2"),
        ("qr", "10"),
        ("bh", "2"),
        ("bh", "10"),
    ]
    configs = {(m, r): c for m, r, c in runs}
    assert configs[("bh", "10")].embedding_compression == 10.0
    assert configs[("amtl", "pen0.02")].embedding_options == {"amtl": {"length_penalty": 0.02}}


def test_plot_writes_a_png(tmp_path):
    rows = [
        {"method": "full", "serve_bytes": 1e6, "auc_mean": 0.79, "auc_std": 0.001},
        {"method": "bh", "serve_bytes": 1e4, "auc_mean": 0.78, "auc_std": 0.002},
        {"method": "bh", "serve_bytes": 1e5, "auc_mean": 0.785, "auc_std": 0.001},
    ]
    plot(rows, tmp_path / "p.png", "t")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
