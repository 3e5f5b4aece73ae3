// volk's implementation (Debian's libvulkan-volk-dev ships volk.c beside volk.h), compiled once here: the
// Vulkan loader is opened at run time (device/vulkan.cpp), not linked.
#define VOLK_IMPLEMENTATION
#include <volk.h>
