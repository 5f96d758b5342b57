# chat/llm.py: a stand-in for your model's client, streaming the prompt's words back
from dataclasses import dataclass


@dataclass
class Usage:
    total_tokens: int


@dataclass
class Chunk:
    text: str


class Stream:
    def __init__(self, words):
        self.words = words
        self.usage = Usage(total_tokens=0)  # known once the stream has ended

    def __iter__(self):
        for word in self.words:
            self.usage.total_tokens += 1  # a word a token
            yield Chunk(f"{word} ")


@dataclass
class Completion:
    text: str
    usage: Usage


def stream(prompt):
    return Stream(prompt.split())


def complete(prompt):
    return Completion(prompt, Usage(total_tokens=len(prompt.split())))
