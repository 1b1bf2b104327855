/*
 * A one-function bcryptprimitives.dll for Wine 8.0 (Debian 12), which lacks it: Rust's
 * standard library imports ProcessPrng from it, so a Rust .exe does not start under that Wine
 * (status c0000135). Only scripts/test.sh uses it, to run kpng.exe; Windows has the real DLL.
 * Built with: x86_64-w64-mingw32-gcc -shared -o bcryptprimitives.dll bcryptprimitives.c -ladvapi32
 */
#include <windows.h>

/* RtlGenRandom: advapi32's SystemFunction036. */
BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T length)
{
    while (length > 0) {
        ULONG chunk = length > 0x7fffffff ? 0x7fffffff : (ULONG)length;
        if (!SystemFunction036(data, chunk))
            return FALSE;
        data += chunk;
        length -= chunk;
    }
    return TRUE;
}
