"""The template's data modules: splitting, checks and preprocessing apart from where the samples
come from, and the modules for a file, an image folder, texts and LitData shards."""

from typing import TYPE_CHECKING

from .base import ArrayDataModule
from .contract import SupervisedDataModule, gives_sizes
from .file import FileDataModule
from .images import ImageFolderDataModule
from .preprocessing import Preprocessing
from .tables import Table, read_table
from .text import TextDataModule

if TYPE_CHECKING:
    from .streaming import StreamingDataModule as StreamingDataModule

__all__ = [
    "ArrayDataModule",
    "FileDataModule",
    "ImageFolderDataModule",
    "Preprocessing",
    "SupervisedDataModule",
    "Table",
    "TextDataModule",
    "gives_sizes",
    "read_table",
]


def __getattr__(name: str) -> object:
    # StreamingDataModule is imported when first asked for (its class path in a config), and left
    # out of __all__ so that ``import *`` does not import it: LitData and the object-storage
    # clients it brings (boto3, requests), 290 modules, took 0.2 to 0.3 s to import, which every
    # command would otherwise pay.
    if name == "StreamingDataModule":
        from .streaming import StreamingDataModule

        return StreamingDataModule
    raise AttributeError(name)
