"""Pre-tokenized training data, as the nodes read it (no Django here).

    python -m recipes.node.prepare_data SOURCE TARGET [--tokenizer FOLDER] [--shard-tokens N]

turns a folder of documents (.jsonl rows with a "text" field, .parquet files with a "text" column,
.txt files, one document each; read in name order, subfolders too) into TARGET: shards of uint32 token
ids (tokens-00000.bin, ...), every document as BOS, its tokens, EOS (the model learns where one ends),
and index.json (the shards, token and document counts, the tokenizer). Training reads it through
numpy memmaps (load()), so a data set of billions of tokens costs no memory, and packs it into
sequences that cross document boundaries (every position is a token read: nothing is padded).

A run names TARGET as its dataset (a folder in the cluster's shared home). The tokenizer is the
model's: the bytes tokenizer of the tiny profiles by default, or a Hugging Face folder's (--tokenizer),
which must be the one the run trains with (index.json says which; train.py refuses another).
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

FORMAT = "tcc-tokens-1"
SHARD_TOKENS = 1 << 26  # 64 Mi tokens, 256 MiB per shard


def documents(source):
    """Every document's text under `source`, in file-name order (then row order)."""
    for path in sorted(p for p in Path(source).rglob("*") if p.is_file()):
        if path.suffix == ".jsonl":
            for line in path.read_text().splitlines():
                if line.strip():
                    text = json.loads(line).get("text")
                    if isinstance(text, str) and text:
                        yield text
        elif path.suffix == ".parquet":
            import pyarrow.parquet

            for text in pyarrow.parquet.read_table(path, columns=["text"]).column("text").to_pylist():
                if isinstance(text, str) and text:
                    yield text
        elif path.suffix == ".txt":
            text = path.read_text()
            if text:
                yield text


def prepare(source, target, tokenizer, tokenizer_name="bytes", shard_tokens=SHARD_TOKENS):
    """Tokenize `source` into `target` (written beside it, then moved: never seen half made); its index."""
    import numpy as np

    target = Path(target)
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    shards, buffer, total, count = [], [], 0, 0

    def flush():
        if buffer:
            name = f"tokens-{len(shards):05d}.bin"
            np.asarray(buffer, dtype=np.uint32).tofile(partial / name)
            shards.append({"file": name, "tokens": len(buffer)})
            buffer.clear()

    for text in documents(source):
        ids = tokenizer.encode(text)  # BOS, the text, EOS
        count += 1
        total += len(ids)
        while ids:
            room = shard_tokens - len(buffer)
            buffer.extend(ids[:room])
            ids = ids[room:]
            if len(buffer) >= shard_tokens:
                flush()
    flush()
    if not count:
        shutil.rmtree(partial)
        raise SystemExit(f"no document in {source} (.jsonl rows with a text field, .parquet with a text column, .txt)")
    index = {"format": FORMAT, "dtype": "uint32", "tokens": total, "documents": count, "tokenizer": tokenizer_name,
             "eos": tokenizer.eos, "shards": shards}  # fmt: skip
    (partial / "index.json").write_text(json.dumps(index, indent=2))
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return index


def is_prepared(path):
    return (Path(path) / "index.json").is_file()


class Tokens:
    """The shards of a prepared folder as one sequence of token ids: len() and slices (numpy arrays)."""

    def __init__(self, folder):
        import numpy as np

        folder = Path(folder)
        self.index = json.loads((folder / "index.json").read_text())
        if self.index.get("format") != FORMAT:
            raise SystemExit(f"{folder} is not a data set prepared by recipes.node.prepare_data (format {FORMAT})")
        self.shards = [np.memmap(folder / s["file"], dtype=np.uint32, mode="r") for s in self.index["shards"]]
        self.starts = []
        start = 0
        for shard in self.shards:
            self.starts.append(start)
            start += len(shard)
        self.length = start

    def __len__(self):
        return self.length

    def __getitem__(self, window):
        import numpy as np

        if not isinstance(window, slice) or window.step not in (None, 1):
            raise TypeError("Tokens take contiguous slices only")
        begin, end, _ = window.indices(self.length)
        pieces = []
        for start, shard in zip(self.starts, self.shards, strict=True):
            low, high = max(begin, start), min(end, start + len(shard))
            if low < high:
                pieces.append(shard[low - start : high - start])
        return np.concatenate(pieces).astype(np.int64) if pieces else np.zeros(0, dtype=np.int64)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Pre-tokenize a folder of documents for training")
    parser.add_argument("source", help='a folder of .jsonl ({"text"} rows), .parquet (a text column) and .txt files')
    parser.add_argument("target", help="the folder to write: token shards and index.json (a run's dataset)")
    parser.add_argument("--tokenizer", help="a Hugging Face folder whose tokenizer the run uses (default: bytes)")
    parser.add_argument("--shard-tokens", type=int, default=SHARD_TOKENS)
    args = parser.parse_args(argv)
    from recipes.node.train import ByteTokenizer, FolderTokenizer

    tokenizer = FolderTokenizer(args.tokenizer) if args.tokenizer else ByteTokenizer()
    name = str(Path(args.tokenizer).resolve()) if args.tokenizer else "bytes"
    index = prepare(args.source, args.target, tokenizer, name, args.shard_tokens)
    print(f"{index['documents']} documents, {index['tokens']} tokens in {len(index['shards'])} shard(s): {args.target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
