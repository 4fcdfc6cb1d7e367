// For files that include OpenCL's headers: common/images.h's numbers are OpenCL's own.
// Header-only (raccel_common itself does not use OpenCL).
#pragma once

#include <CL/cl.h>

#include "common/images.h"

namespace raccel::image {
static_assert(kImage2d == CL_MEM_OBJECT_IMAGE2D && kImage3d == CL_MEM_OBJECT_IMAGE3D &&
              kImage2dArray == CL_MEM_OBJECT_IMAGE2D_ARRAY && kImage1d == CL_MEM_OBJECT_IMAGE1D &&
              kImage1dArray == CL_MEM_OBJECT_IMAGE1D_ARRAY && kImage1dBuffer == CL_MEM_OBJECT_IMAGE1D_BUFFER);
static_assert(kFirstOrder == CL_R && kLastOrder == CL_ABGR);
static_assert(kFirstChannelType == CL_SNORM_INT8 && kLastChannelType == CL_UNORM_INT_101010_2);
static_assert(kAddressNone == CL_ADDRESS_NONE && kAddressMirroredRepeat == CL_ADDRESS_MIRRORED_REPEAT);
static_assert(kFilterNearest == CL_FILTER_NEAREST && kFilterLinear == CL_FILTER_LINEAR);
}  // namespace raccel::image
