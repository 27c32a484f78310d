"""Evaluation: backtest metrics (PnL, Sharpe, drawdown, PSR/DSR) computed from per-bar positions and returns."""
