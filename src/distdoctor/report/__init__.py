"""Renderers shared by diagnose and sim: text, json, html, png, chrome-trace."""
