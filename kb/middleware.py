"""Middleware of the web process, written as plain functions: ``refuse`` answers a request before
any view sees it (None: pass it on), ``translate`` rewrites a response on its way out. Django runs
each in its sync or its async chain, whichever it is given."""

from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest, HttpResponse
from django.utils.decorators import sync_and_async_middleware

Refuse = Callable[[HttpRequest], HttpResponse | None]
Translate = Callable[[HttpRequest, HttpResponse], HttpResponse]


def request_middleware(
    *, refuse: Refuse = lambda request: None, translate: Translate = lambda request, response: response
) -> Callable[[Callable[[HttpRequest], Any]], Callable[[HttpRequest], Any]]:
    def factory(get_response: Callable[[HttpRequest], Any]) -> Callable[[HttpRequest], Any]:
        if iscoroutinefunction(get_response):

            async def async_middleware(request: HttpRequest) -> HttpResponse:
                refusal = refuse(request)
                return refusal if refusal is not None else translate(request, await get_response(request))

            return async_middleware

        def middleware(request: HttpRequest) -> HttpResponse:
            refusal = refuse(request)
            return refusal if refusal is not None else translate(request, get_response(request))

        return middleware

    return sync_and_async_middleware(factory)
