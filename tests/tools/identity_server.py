#!/usr/bin/env python3
"""A backend's TCP service for tests and the demo: on every connection it
first sends one line `backend=<name>`, then echoes whatever it receives until
the client closes. Serves on every address of the host (so on the VIPs on lo).

    identity_server.py NAME PORT [PORT...]
"""
import asyncio
import sys


async def serve(name, port):
    hello = f"backend={name}\n".encode()

    async def handle(reader, writer):
        try:
            writer.write(hello)
            await writer.drain()
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, host=None, port=port, reuse_address=True,
                                        backlog=4096)
    async with server:
        await server.serve_forever()


async def main():
    name = sys.argv[1]
    ports = [int(p) for p in sys.argv[2:]]
    await asyncio.gather(*(serve(name, p) for p in ports))


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
