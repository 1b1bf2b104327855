/*
 * A stand-in computenetwork.dll for Wine, which has none: kpng.exe imports HCN's functions, so
 * without this DLL the loader refuses to start it. Every function answers
 * RPC_S_SERVER_UNAVAILABLE (HNS is not running), which kpng treats as "HNS unavailable"; the
 * Wine checks of scripts/test.sh use --hcn-simulator and never reach it.
 * Built with: x86_64-w64-mingw32-gcc -shared -o computenetwork.dll computenetwork.c
 */
#include <windows.h>

#define UNAVAILABLE ((HRESULT)0x800706BAL)
#define HCN(name) __declspec(dllexport) HRESULT WINAPI name(void) { return UNAVAILABLE; }

HCN(HcnEnumerateNetworks)
HCN(HcnEnumerateEndpoints)
HCN(HcnEnumerateLoadBalancers)
HCN(HcnOpenNetwork)
HCN(HcnOpenEndpoint)
HCN(HcnOpenLoadBalancer)
HCN(HcnQueryNetworkProperties)
HCN(HcnQueryEndpointProperties)
HCN(HcnQueryLoadBalancerProperties)
HCN(HcnCloseNetwork)
HCN(HcnCloseEndpoint)
HCN(HcnCloseLoadBalancer)
HCN(HcnCreateEndpoint)
HCN(HcnCreateLoadBalancer)
HCN(HcnDeleteEndpoint)
HCN(HcnDeleteLoadBalancer)
