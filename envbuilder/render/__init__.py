"""Renderers: each formats a Plan (or a Stack) into one file. They decide nothing."""
