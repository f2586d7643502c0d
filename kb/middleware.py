"""Middleware of the web process, written as plain functions: ``refuse`` answers a request before
any view sees it (None: pass it on), ``translate`` rewrites a response on its way out. Django runs
each in its sync or its async chain, whichever it is given."""

from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.http import HttpRequest, HttpResponse
from django.utils.decorators import sync_and_async_middleware

Refuse = Callable[[HttpRequest], HttpResponse | None]
Translate = Callable[[HttpRequest, HttpResponse], HttpResponse]


def request_middleware(
    *,
    refuse: Refuse = lambda request: None,
    translate: Translate = lambda request, response: response,
    refuse_in_thread: Callable[[HttpRequest], bool] = lambda request: False,
) -> Callable[[Callable[[HttpRequest], Any]], Callable[[HttpRequest], Any]]:
    """``refuse_in_thread``: the requests whose ``refuse`` may block (it reads an uploaded body),
    run in a thread under ASGI rather than in the event loop every other request shares."""

    def factory(get_response: Callable[[HttpRequest], Any]) -> Callable[[HttpRequest], Any]:
        if iscoroutinefunction(get_response):

            async def async_middleware(request: HttpRequest) -> HttpResponse:
                refusal = await sync_to_async(refuse)(request) if refuse_in_thread(request) else refuse(request)
                return refusal if refusal is not None else translate(request, await get_response(request))

            return async_middleware

        def middleware(request: HttpRequest) -> HttpResponse:
            refusal = refuse(request)
            return refusal if refusal is not None else translate(request, get_response(request))

        return middleware

    return sync_and_async_middleware(factory)
