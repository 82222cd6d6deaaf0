"""Input kind ``folder``: a folder of images (local or a URL), each named by its path below the folder."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from hardrank import urls
from hardrank.inputs.kind import InputKind, InputOptions, Items, Source, UnknownInput
from hardrank.items import ImageRef

__all__ = ["KIND", "IMAGE_EXTENSIONS"]

IMAGE_EXTENSIONS = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff"}


class _ImageFolder(InputKind):
    name = "folder"
    describe = "an image folder"
    remote = True  # a folder URL is listed, its images read by the workers that decode them

    def detect(self, path: str) -> bool:
        return urls.is_dir(path)  # any folder no kind before this one claimed

    def open(self, path: str, options: InputOptions) -> Source:
        if urls.is_url(path):
            files = [f for f in urls.list_files(path) if os.path.splitext(f)[1].lower() in IMAGE_EXTENSIONS]
            root = path.rstrip("/") + "/"
            ids = [f[len(root):] if f.startswith(root) else f for f in files]
        else:
            p = Path(path)
            local = sorted(f for f in p.rglob("*") if f.suffix.lower() in IMAGE_EXTENSIONS and f.is_file())
            files, ids = [os.fspath(f) for f in local], [f.relative_to(p).as_posix() for f in local]
        if not files:
            raise UnknownInput(f"{path}: folder holds no images ({', '.join(sorted(IMAGE_EXTENSIONS))})")
        return Source(self.name, path, {"image": Items(ids, [ImageRef(f) for f in files], np.arange(len(files)))},
                      path_ids=True)


KIND = _ImageFolder()
