# chat/views.py
from django.http import StreamingHttpResponse

from django_throttle import settle

from . import llm


def complete(request):
    stream = llm.stream(prompt=request.POST["prompt"])  # your model client

    def tokens():
        for chunk in stream:
            yield chunk.text
        settle(request, stream.usage.total_tokens)  # counted once the stream has ended

    return StreamingHttpResponse(tokens(), content_type="text/plain")
