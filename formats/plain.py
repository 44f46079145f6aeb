"""Handlers for the plain input containers (.npz, .safetensors)."""

from __future__ import annotations

from .registry import FormatHandler
from .sources import load_npz, load_safetensors, save_npz, save_safetensors

HANDLERS = {
    "npz": FormatHandler(
        name="npz", suffixes=(".npz",), sniff=lambda head: False,
        load=load_npz, save=save_npz),
    "safetensors": FormatHandler(
        name="safetensors", suffixes=(".safetensors",), sniff=lambda head: False,
        load=load_safetensors, save=save_safetensors),
}
