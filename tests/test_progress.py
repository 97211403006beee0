"""Progress bars in logs: whole lines, no carriage-return redraws."""

import io

from specdec_jax.runtime import progress


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_log_gets_whole_lines_and_the_final_count(monkeypatch):
    monkeypatch.delenv(progress.ENV, raising=False)  # a user's switch must not hide the bar
    monkeypatch.setattr(progress, "LOG_INTERVAL_S", 0.0)
    log = io.StringIO()
    for _ in progress.tqdm(range(5), desc="work", file=log, leave=False):
        pass
    text = log.getvalue()
    assert "\r" not in text
    lines = text.strip().split("\n")
    assert all(line.startswith("work:") for line in lines)
    assert "5/5" in lines[-1]  # the finished bar is kept even with leave=False


def test_a_terminal_gets_tqdm_and_the_switch_turns_bars_off(monkeypatch):
    monkeypatch.delenv(progress.ENV, raising=False)
    terminal = _Terminal()
    for _ in progress.tqdm(range(3), desc="work", file=terminal):
        pass
    assert "\r" in terminal.getvalue()
    monkeypatch.setenv(progress.ENV, "0")
    log = io.StringIO()
    for _ in progress.tqdm(range(3), desc="work", file=log):
        pass
    assert log.getvalue() == ""


def test_postfix_changes_wait_for_the_rate_limited_line(monkeypatch):
    monkeypatch.delenv(progress.ENV, raising=False)
    log = io.StringIO()
    bar = progress.tqdm(range(100), desc="train", file=log)  # 30 s interval
    for step in bar:
        bar.set_postfix(loss=f"{1.0 / (step + 1):.4f}")
        bar.set_postfix_str(f"point {step}")
    lines = log.getvalue().strip().split("\n")
    # The opening line and the final one; a redraw per postfix would give 200 more.
    assert len(lines) <= 3, lines
    assert "100/100" in lines[-1] and "point 99" in lines[-1]
