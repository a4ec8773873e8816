"""Stand-in for ComfyUI's ``folder_paths``: where model files of each kind are looked up."""

from __future__ import annotations

import os

supported_pt_extensions = {".ckpt", ".pt", ".pt2", ".bin", ".pth", ".safetensors", ".pkl", ".sft"}

folder_names_and_paths: dict[str, tuple[list[str], set[str]]] = {
    "checkpoints": ([], supported_pt_extensions),
    "embeddings": ([], supported_pt_extensions),
}


def add_model_folder_path(
    folder_name: str, full_folder_path: str, is_default: bool = False
) -> None:
    paths, _extensions = folder_names_and_paths.setdefault(folder_name, ([], set()))
    if full_folder_path not in paths:
        if is_default:
            paths.insert(0, full_folder_path)
        else:
            paths.append(full_folder_path)


def get_folder_paths(folder_name: str) -> list[str]:
    return folder_names_and_paths[folder_name][0][:]


def get_full_path(folder_name: str, filename: str) -> str | None:
    filename = os.path.relpath(os.path.join("/", filename), "/")
    for folder in get_folder_paths(folder_name):
        full_path = os.path.join(folder, filename)
        if os.path.isfile(full_path):
            return full_path
    return None


def get_full_path_or_raise(folder_name: str, filename: str) -> str:
    full_path = get_full_path(folder_name, filename)
    if full_path is None:
        raise FileNotFoundError(
            f"Model in folder '{folder_name}' with filename '{filename}' not found."
        )
    return full_path


def get_filename_list(folder_name: str) -> list[str]:
    names: list[str] = []
    for folder in get_folder_paths(folder_name):
        for root, _dirs, files in os.walk(folder):
            names += [os.path.relpath(os.path.join(root, f), folder) for f in files]
    return sorted(names)
