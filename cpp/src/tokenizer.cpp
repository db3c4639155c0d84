// Paper §4, "Tokenization: How Text is Represented": the pre-tokenizer, byte-level BPE (training and
// encoding), the character- and word-level tokenizers, chunking, and the JSON save format.
// The rules and design decisions are stated in tokenizer.hpp and docs/tokenization.md.
#include "formal_transformers/tokenizer.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <queue>
#include <unordered_map>

namespace ft {

// =====================================================================================================
// Character classes. ASCII by table; above it a range table of Unicode 14.0 letters (L*) and numbers
// (N*) generated from Python 3.11's unicodedata with
//     cls = lambda c: {'L': 'L', 'N': 'N'}.get(unicodedata.category(chr(c))[0])
// (maximal runs of equal non-empty cls over 0x80..0x10FFFF), and the White_Space property by hand.
namespace detail {

namespace {
constexpr std::uint8_t O_ = 0, L_ = 1, N_ = 2, S_ = 3;
}  // namespace

// clang-format off
const std::uint8_t ascii_class[128] = {
    O_, O_, O_, O_, O_, O_, O_, O_, O_, S_, S_, S_, S_, S_, O_, O_,  // \t \n \v \f \r are White_Space
    O_, O_, O_, O_, O_, O_, O_, O_, O_, O_, O_, O_, O_, O_, O_, O_,  // 0x1C..0x1F are not (unlike str.isspace)
    S_, O_, O_, O_, O_, O_, O_, O_, O_, O_, O_, O_, O_, O_, O_, O_,
    N_, N_, N_, N_, N_, N_, N_, N_, N_, N_, O_, O_, O_, O_, O_, O_,
    O_, L_, L_, L_, L_, L_, L_, L_, L_, L_, L_, L_, L_, L_, L_, L_,
    L_, L_, L_, L_, L_, L_, L_, L_, L_, L_, L_, O_, O_, O_, O_, O_,
    O_, L_, L_, L_, L_, L_, L_, L_, L_, L_, L_, L_, L_, L_, L_, L_,
    L_, L_, L_, L_, L_, L_, L_, L_, L_, L_, L_, O_, O_, O_, O_, O_,
};
// clang-format on

namespace {
struct Range {
    std::int32_t lo, hi;
    std::uint8_t k;
};
constexpr std::uint8_t L = L_, N = N_;
// clang-format off
const Range letter_number_ranges[] = {
    {0xAA,0xAA,L}, {0xB2,0xB3,N}, {0xB5,0xB5,L}, {0xB9,0xB9,N}, {0xBA,0xBA,L}, {0xBC,0xBE,N}, {0xC0,0xD6,L},
    {0xD8,0xF6,L}, {0xF8,0x2C1,L}, {0x2C6,0x2D1,L}, {0x2E0,0x2E4,L}, {0x2EC,0x2EC,L}, {0x2EE,0x2EE,L},
    {0x370,0x374,L}, {0x376,0x377,L}, {0x37A,0x37D,L}, {0x37F,0x37F,L}, {0x386,0x386,L}, {0x388,0x38A,L},
    {0x38C,0x38C,L}, {0x38E,0x3A1,L}, {0x3A3,0x3F5,L}, {0x3F7,0x481,L}, {0x48A,0x52F,L}, {0x531,0x556,L},
    {0x559,0x559,L}, {0x560,0x588,L}, {0x5D0,0x5EA,L}, {0x5EF,0x5F2,L}, {0x620,0x64A,L}, {0x660,0x669,N},
    {0x66E,0x66F,L}, {0x671,0x6D3,L}, {0x6D5,0x6D5,L}, {0x6E5,0x6E6,L}, {0x6EE,0x6EF,L}, {0x6F0,0x6F9,N},
    {0x6FA,0x6FC,L}, {0x6FF,0x6FF,L}, {0x710,0x710,L}, {0x712,0x72F,L}, {0x74D,0x7A5,L}, {0x7B1,0x7B1,L},
    {0x7C0,0x7C9,N}, {0x7CA,0x7EA,L}, {0x7F4,0x7F5,L}, {0x7FA,0x7FA,L}, {0x800,0x815,L}, {0x81A,0x81A,L},
    {0x824,0x824,L}, {0x828,0x828,L}, {0x840,0x858,L}, {0x860,0x86A,L}, {0x870,0x887,L}, {0x889,0x88E,L},
    {0x8A0,0x8C9,L}, {0x904,0x939,L}, {0x93D,0x93D,L}, {0x950,0x950,L}, {0x958,0x961,L}, {0x966,0x96F,N},
    {0x971,0x980,L}, {0x985,0x98C,L}, {0x98F,0x990,L}, {0x993,0x9A8,L}, {0x9AA,0x9B0,L}, {0x9B2,0x9B2,L},
    {0x9B6,0x9B9,L}, {0x9BD,0x9BD,L}, {0x9CE,0x9CE,L}, {0x9DC,0x9DD,L}, {0x9DF,0x9E1,L}, {0x9E6,0x9EF,N},
    {0x9F0,0x9F1,L}, {0x9F4,0x9F9,N}, {0x9FC,0x9FC,L}, {0xA05,0xA0A,L}, {0xA0F,0xA10,L}, {0xA13,0xA28,L},
    {0xA2A,0xA30,L}, {0xA32,0xA33,L}, {0xA35,0xA36,L}, {0xA38,0xA39,L}, {0xA59,0xA5C,L}, {0xA5E,0xA5E,L},
    {0xA66,0xA6F,N}, {0xA72,0xA74,L}, {0xA85,0xA8D,L}, {0xA8F,0xA91,L}, {0xA93,0xAA8,L}, {0xAAA,0xAB0,L},
    {0xAB2,0xAB3,L}, {0xAB5,0xAB9,L}, {0xABD,0xABD,L}, {0xAD0,0xAD0,L}, {0xAE0,0xAE1,L}, {0xAE6,0xAEF,N},
    {0xAF9,0xAF9,L}, {0xB05,0xB0C,L}, {0xB0F,0xB10,L}, {0xB13,0xB28,L}, {0xB2A,0xB30,L}, {0xB32,0xB33,L},
    {0xB35,0xB39,L}, {0xB3D,0xB3D,L}, {0xB5C,0xB5D,L}, {0xB5F,0xB61,L}, {0xB66,0xB6F,N}, {0xB71,0xB71,L},
    {0xB72,0xB77,N}, {0xB83,0xB83,L}, {0xB85,0xB8A,L}, {0xB8E,0xB90,L}, {0xB92,0xB95,L}, {0xB99,0xB9A,L},
    {0xB9C,0xB9C,L}, {0xB9E,0xB9F,L}, {0xBA3,0xBA4,L}, {0xBA8,0xBAA,L}, {0xBAE,0xBB9,L}, {0xBD0,0xBD0,L},
    {0xBE6,0xBF2,N}, {0xC05,0xC0C,L}, {0xC0E,0xC10,L}, {0xC12,0xC28,L}, {0xC2A,0xC39,L}, {0xC3D,0xC3D,L},
    {0xC58,0xC5A,L}, {0xC5D,0xC5D,L}, {0xC60,0xC61,L}, {0xC66,0xC6F,N}, {0xC78,0xC7E,N}, {0xC80,0xC80,L},
    {0xC85,0xC8C,L}, {0xC8E,0xC90,L}, {0xC92,0xCA8,L}, {0xCAA,0xCB3,L}, {0xCB5,0xCB9,L}, {0xCBD,0xCBD,L},
    {0xCDD,0xCDE,L}, {0xCE0,0xCE1,L}, {0xCE6,0xCEF,N}, {0xCF1,0xCF2,L}, {0xD04,0xD0C,L}, {0xD0E,0xD10,L},
    {0xD12,0xD3A,L}, {0xD3D,0xD3D,L}, {0xD4E,0xD4E,L}, {0xD54,0xD56,L}, {0xD58,0xD5E,N}, {0xD5F,0xD61,L},
    {0xD66,0xD78,N}, {0xD7A,0xD7F,L}, {0xD85,0xD96,L}, {0xD9A,0xDB1,L}, {0xDB3,0xDBB,L}, {0xDBD,0xDBD,L},
    {0xDC0,0xDC6,L}, {0xDE6,0xDEF,N}, {0xE01,0xE30,L}, {0xE32,0xE33,L}, {0xE40,0xE46,L}, {0xE50,0xE59,N},
    {0xE81,0xE82,L}, {0xE84,0xE84,L}, {0xE86,0xE8A,L}, {0xE8C,0xEA3,L}, {0xEA5,0xEA5,L}, {0xEA7,0xEB0,L},
    {0xEB2,0xEB3,L}, {0xEBD,0xEBD,L}, {0xEC0,0xEC4,L}, {0xEC6,0xEC6,L}, {0xED0,0xED9,N}, {0xEDC,0xEDF,L},
    {0xF00,0xF00,L}, {0xF20,0xF33,N}, {0xF40,0xF47,L}, {0xF49,0xF6C,L}, {0xF88,0xF8C,L}, {0x1000,0x102A,L},
    {0x103F,0x103F,L}, {0x1040,0x1049,N}, {0x1050,0x1055,L}, {0x105A,0x105D,L}, {0x1061,0x1061,L},
    {0x1065,0x1066,L}, {0x106E,0x1070,L}, {0x1075,0x1081,L}, {0x108E,0x108E,L}, {0x1090,0x1099,N},
    {0x10A0,0x10C5,L}, {0x10C7,0x10C7,L}, {0x10CD,0x10CD,L}, {0x10D0,0x10FA,L}, {0x10FC,0x1248,L},
    {0x124A,0x124D,L}, {0x1250,0x1256,L}, {0x1258,0x1258,L}, {0x125A,0x125D,L}, {0x1260,0x1288,L},
    {0x128A,0x128D,L}, {0x1290,0x12B0,L}, {0x12B2,0x12B5,L}, {0x12B8,0x12BE,L}, {0x12C0,0x12C0,L},
    {0x12C2,0x12C5,L}, {0x12C8,0x12D6,L}, {0x12D8,0x1310,L}, {0x1312,0x1315,L}, {0x1318,0x135A,L},
    {0x1369,0x137C,N}, {0x1380,0x138F,L}, {0x13A0,0x13F5,L}, {0x13F8,0x13FD,L}, {0x1401,0x166C,L},
    {0x166F,0x167F,L}, {0x1681,0x169A,L}, {0x16A0,0x16EA,L}, {0x16EE,0x16F0,N}, {0x16F1,0x16F8,L},
    {0x1700,0x1711,L}, {0x171F,0x1731,L}, {0x1740,0x1751,L}, {0x1760,0x176C,L}, {0x176E,0x1770,L},
    {0x1780,0x17B3,L}, {0x17D7,0x17D7,L}, {0x17DC,0x17DC,L}, {0x17E0,0x17E9,N}, {0x17F0,0x17F9,N},
    {0x1810,0x1819,N}, {0x1820,0x1878,L}, {0x1880,0x1884,L}, {0x1887,0x18A8,L}, {0x18AA,0x18AA,L},
    {0x18B0,0x18F5,L}, {0x1900,0x191E,L}, {0x1946,0x194F,N}, {0x1950,0x196D,L}, {0x1970,0x1974,L},
    {0x1980,0x19AB,L}, {0x19B0,0x19C9,L}, {0x19D0,0x19DA,N}, {0x1A00,0x1A16,L}, {0x1A20,0x1A54,L},
    {0x1A80,0x1A89,N}, {0x1A90,0x1A99,N}, {0x1AA7,0x1AA7,L}, {0x1B05,0x1B33,L}, {0x1B45,0x1B4C,L},
    {0x1B50,0x1B59,N}, {0x1B83,0x1BA0,L}, {0x1BAE,0x1BAF,L}, {0x1BB0,0x1BB9,N}, {0x1BBA,0x1BE5,L},
    {0x1C00,0x1C23,L}, {0x1C40,0x1C49,N}, {0x1C4D,0x1C4F,L}, {0x1C50,0x1C59,N}, {0x1C5A,0x1C7D,L},
    {0x1C80,0x1C88,L}, {0x1C90,0x1CBA,L}, {0x1CBD,0x1CBF,L}, {0x1CE9,0x1CEC,L}, {0x1CEE,0x1CF3,L},
    {0x1CF5,0x1CF6,L}, {0x1CFA,0x1CFA,L}, {0x1D00,0x1DBF,L}, {0x1E00,0x1F15,L}, {0x1F18,0x1F1D,L},
    {0x1F20,0x1F45,L}, {0x1F48,0x1F4D,L}, {0x1F50,0x1F57,L}, {0x1F59,0x1F59,L}, {0x1F5B,0x1F5B,L},
    {0x1F5D,0x1F5D,L}, {0x1F5F,0x1F7D,L}, {0x1F80,0x1FB4,L}, {0x1FB6,0x1FBC,L}, {0x1FBE,0x1FBE,L},
    {0x1FC2,0x1FC4,L}, {0x1FC6,0x1FCC,L}, {0x1FD0,0x1FD3,L}, {0x1FD6,0x1FDB,L}, {0x1FE0,0x1FEC,L},
    {0x1FF2,0x1FF4,L}, {0x1FF6,0x1FFC,L}, {0x2070,0x2070,N}, {0x2071,0x2071,L}, {0x2074,0x2079,N},
    {0x207F,0x207F,L}, {0x2080,0x2089,N}, {0x2090,0x209C,L}, {0x2102,0x2102,L}, {0x2107,0x2107,L},
    {0x210A,0x2113,L}, {0x2115,0x2115,L}, {0x2119,0x211D,L}, {0x2124,0x2124,L}, {0x2126,0x2126,L},
    {0x2128,0x2128,L}, {0x212A,0x212D,L}, {0x212F,0x2139,L}, {0x213C,0x213F,L}, {0x2145,0x2149,L},
    {0x214E,0x214E,L}, {0x2150,0x2182,N}, {0x2183,0x2184,L}, {0x2185,0x2189,N}, {0x2460,0x249B,N},
    {0x24EA,0x24FF,N}, {0x2776,0x2793,N}, {0x2C00,0x2CE4,L}, {0x2CEB,0x2CEE,L}, {0x2CF2,0x2CF3,L},
    {0x2CFD,0x2CFD,N}, {0x2D00,0x2D25,L}, {0x2D27,0x2D27,L}, {0x2D2D,0x2D2D,L}, {0x2D30,0x2D67,L},
    {0x2D6F,0x2D6F,L}, {0x2D80,0x2D96,L}, {0x2DA0,0x2DA6,L}, {0x2DA8,0x2DAE,L}, {0x2DB0,0x2DB6,L},
    {0x2DB8,0x2DBE,L}, {0x2DC0,0x2DC6,L}, {0x2DC8,0x2DCE,L}, {0x2DD0,0x2DD6,L}, {0x2DD8,0x2DDE,L},
    {0x2E2F,0x2E2F,L}, {0x3005,0x3006,L}, {0x3007,0x3007,N}, {0x3021,0x3029,N}, {0x3031,0x3035,L},
    {0x3038,0x303A,N}, {0x303B,0x303C,L}, {0x3041,0x3096,L}, {0x309D,0x309F,L}, {0x30A1,0x30FA,L},
    {0x30FC,0x30FF,L}, {0x3105,0x312F,L}, {0x3131,0x318E,L}, {0x3192,0x3195,N}, {0x31A0,0x31BF,L},
    {0x31F0,0x31FF,L}, {0x3220,0x3229,N}, {0x3248,0x324F,N}, {0x3251,0x325F,N}, {0x3280,0x3289,N},
    {0x32B1,0x32BF,N}, {0x3400,0x4DBF,L}, {0x4E00,0xA48C,L}, {0xA4D0,0xA4FD,L}, {0xA500,0xA60C,L},
    {0xA610,0xA61F,L}, {0xA620,0xA629,N}, {0xA62A,0xA62B,L}, {0xA640,0xA66E,L}, {0xA67F,0xA69D,L},
    {0xA6A0,0xA6E5,L}, {0xA6E6,0xA6EF,N}, {0xA717,0xA71F,L}, {0xA722,0xA788,L}, {0xA78B,0xA7CA,L},
    {0xA7D0,0xA7D1,L}, {0xA7D3,0xA7D3,L}, {0xA7D5,0xA7D9,L}, {0xA7F2,0xA801,L}, {0xA803,0xA805,L},
    {0xA807,0xA80A,L}, {0xA80C,0xA822,L}, {0xA830,0xA835,N}, {0xA840,0xA873,L}, {0xA882,0xA8B3,L},
    {0xA8D0,0xA8D9,N}, {0xA8F2,0xA8F7,L}, {0xA8FB,0xA8FB,L}, {0xA8FD,0xA8FE,L}, {0xA900,0xA909,N},
    {0xA90A,0xA925,L}, {0xA930,0xA946,L}, {0xA960,0xA97C,L}, {0xA984,0xA9B2,L}, {0xA9CF,0xA9CF,L},
    {0xA9D0,0xA9D9,N}, {0xA9E0,0xA9E4,L}, {0xA9E6,0xA9EF,L}, {0xA9F0,0xA9F9,N}, {0xA9FA,0xA9FE,L},
    {0xAA00,0xAA28,L}, {0xAA40,0xAA42,L}, {0xAA44,0xAA4B,L}, {0xAA50,0xAA59,N}, {0xAA60,0xAA76,L},
    {0xAA7A,0xAA7A,L}, {0xAA7E,0xAAAF,L}, {0xAAB1,0xAAB1,L}, {0xAAB5,0xAAB6,L}, {0xAAB9,0xAABD,L},
    {0xAAC0,0xAAC0,L}, {0xAAC2,0xAAC2,L}, {0xAADB,0xAADD,L}, {0xAAE0,0xAAEA,L}, {0xAAF2,0xAAF4,L},
    {0xAB01,0xAB06,L}, {0xAB09,0xAB0E,L}, {0xAB11,0xAB16,L}, {0xAB20,0xAB26,L}, {0xAB28,0xAB2E,L},
    {0xAB30,0xAB5A,L}, {0xAB5C,0xAB69,L}, {0xAB70,0xABE2,L}, {0xABF0,0xABF9,N}, {0xAC00,0xD7A3,L},
    {0xD7B0,0xD7C6,L}, {0xD7CB,0xD7FB,L}, {0xF900,0xFA6D,L}, {0xFA70,0xFAD9,L}, {0xFB00,0xFB06,L},
    {0xFB13,0xFB17,L}, {0xFB1D,0xFB1D,L}, {0xFB1F,0xFB28,L}, {0xFB2A,0xFB36,L}, {0xFB38,0xFB3C,L},
    {0xFB3E,0xFB3E,L}, {0xFB40,0xFB41,L}, {0xFB43,0xFB44,L}, {0xFB46,0xFBB1,L}, {0xFBD3,0xFD3D,L},
    {0xFD50,0xFD8F,L}, {0xFD92,0xFDC7,L}, {0xFDF0,0xFDFB,L}, {0xFE70,0xFE74,L}, {0xFE76,0xFEFC,L},
    {0xFF10,0xFF19,N}, {0xFF21,0xFF3A,L}, {0xFF41,0xFF5A,L}, {0xFF66,0xFFBE,L}, {0xFFC2,0xFFC7,L},
    {0xFFCA,0xFFCF,L}, {0xFFD2,0xFFD7,L}, {0xFFDA,0xFFDC,L}, {0x10000,0x1000B,L}, {0x1000D,0x10026,L},
    {0x10028,0x1003A,L}, {0x1003C,0x1003D,L}, {0x1003F,0x1004D,L}, {0x10050,0x1005D,L}, {0x10080,0x100FA,L},
    {0x10107,0x10133,N}, {0x10140,0x10178,N}, {0x1018A,0x1018B,N}, {0x10280,0x1029C,L}, {0x102A0,0x102D0,L},
    {0x102E1,0x102FB,N}, {0x10300,0x1031F,L}, {0x10320,0x10323,N}, {0x1032D,0x10340,L}, {0x10341,0x10341,N},
    {0x10342,0x10349,L}, {0x1034A,0x1034A,N}, {0x10350,0x10375,L}, {0x10380,0x1039D,L}, {0x103A0,0x103C3,L},
    {0x103C8,0x103CF,L}, {0x103D1,0x103D5,N}, {0x10400,0x1049D,L}, {0x104A0,0x104A9,N}, {0x104B0,0x104D3,L},
    {0x104D8,0x104FB,L}, {0x10500,0x10527,L}, {0x10530,0x10563,L}, {0x10570,0x1057A,L}, {0x1057C,0x1058A,L},
    {0x1058C,0x10592,L}, {0x10594,0x10595,L}, {0x10597,0x105A1,L}, {0x105A3,0x105B1,L}, {0x105B3,0x105B9,L},
    {0x105BB,0x105BC,L}, {0x10600,0x10736,L}, {0x10740,0x10755,L}, {0x10760,0x10767,L}, {0x10780,0x10785,L},
    {0x10787,0x107B0,L}, {0x107B2,0x107BA,L}, {0x10800,0x10805,L}, {0x10808,0x10808,L}, {0x1080A,0x10835,L},
    {0x10837,0x10838,L}, {0x1083C,0x1083C,L}, {0x1083F,0x10855,L}, {0x10858,0x1085F,N}, {0x10860,0x10876,L},
    {0x10879,0x1087F,N}, {0x10880,0x1089E,L}, {0x108A7,0x108AF,N}, {0x108E0,0x108F2,L}, {0x108F4,0x108F5,L},
    {0x108FB,0x108FF,N}, {0x10900,0x10915,L}, {0x10916,0x1091B,N}, {0x10920,0x10939,L}, {0x10980,0x109B7,L},
    {0x109BC,0x109BD,N}, {0x109BE,0x109BF,L}, {0x109C0,0x109CF,N}, {0x109D2,0x109FF,N}, {0x10A00,0x10A00,L},
    {0x10A10,0x10A13,L}, {0x10A15,0x10A17,L}, {0x10A19,0x10A35,L}, {0x10A40,0x10A48,N}, {0x10A60,0x10A7C,L},
    {0x10A7D,0x10A7E,N}, {0x10A80,0x10A9C,L}, {0x10A9D,0x10A9F,N}, {0x10AC0,0x10AC7,L}, {0x10AC9,0x10AE4,L},
    {0x10AEB,0x10AEF,N}, {0x10B00,0x10B35,L}, {0x10B40,0x10B55,L}, {0x10B58,0x10B5F,N}, {0x10B60,0x10B72,L},
    {0x10B78,0x10B7F,N}, {0x10B80,0x10B91,L}, {0x10BA9,0x10BAF,N}, {0x10C00,0x10C48,L}, {0x10C80,0x10CB2,L},
    {0x10CC0,0x10CF2,L}, {0x10CFA,0x10CFF,N}, {0x10D00,0x10D23,L}, {0x10D30,0x10D39,N}, {0x10E60,0x10E7E,N},
    {0x10E80,0x10EA9,L}, {0x10EB0,0x10EB1,L}, {0x10F00,0x10F1C,L}, {0x10F1D,0x10F26,N}, {0x10F27,0x10F27,L},
    {0x10F30,0x10F45,L}, {0x10F51,0x10F54,N}, {0x10F70,0x10F81,L}, {0x10FB0,0x10FC4,L}, {0x10FC5,0x10FCB,N},
    {0x10FE0,0x10FF6,L}, {0x11003,0x11037,L}, {0x11052,0x1106F,N}, {0x11071,0x11072,L}, {0x11075,0x11075,L},
    {0x11083,0x110AF,L}, {0x110D0,0x110E8,L}, {0x110F0,0x110F9,N}, {0x11103,0x11126,L}, {0x11136,0x1113F,N},
    {0x11144,0x11144,L}, {0x11147,0x11147,L}, {0x11150,0x11172,L}, {0x11176,0x11176,L}, {0x11183,0x111B2,L},
    {0x111C1,0x111C4,L}, {0x111D0,0x111D9,N}, {0x111DA,0x111DA,L}, {0x111DC,0x111DC,L}, {0x111E1,0x111F4,N},
    {0x11200,0x11211,L}, {0x11213,0x1122B,L}, {0x11280,0x11286,L}, {0x11288,0x11288,L}, {0x1128A,0x1128D,L},
    {0x1128F,0x1129D,L}, {0x1129F,0x112A8,L}, {0x112B0,0x112DE,L}, {0x112F0,0x112F9,N}, {0x11305,0x1130C,L},
    {0x1130F,0x11310,L}, {0x11313,0x11328,L}, {0x1132A,0x11330,L}, {0x11332,0x11333,L}, {0x11335,0x11339,L},
    {0x1133D,0x1133D,L}, {0x11350,0x11350,L}, {0x1135D,0x11361,L}, {0x11400,0x11434,L}, {0x11447,0x1144A,L},
    {0x11450,0x11459,N}, {0x1145F,0x11461,L}, {0x11480,0x114AF,L}, {0x114C4,0x114C5,L}, {0x114C7,0x114C7,L},
    {0x114D0,0x114D9,N}, {0x11580,0x115AE,L}, {0x115D8,0x115DB,L}, {0x11600,0x1162F,L}, {0x11644,0x11644,L},
    {0x11650,0x11659,N}, {0x11680,0x116AA,L}, {0x116B8,0x116B8,L}, {0x116C0,0x116C9,N}, {0x11700,0x1171A,L},
    {0x11730,0x1173B,N}, {0x11740,0x11746,L}, {0x11800,0x1182B,L}, {0x118A0,0x118DF,L}, {0x118E0,0x118F2,N},
    {0x118FF,0x11906,L}, {0x11909,0x11909,L}, {0x1190C,0x11913,L}, {0x11915,0x11916,L}, {0x11918,0x1192F,L},
    {0x1193F,0x1193F,L}, {0x11941,0x11941,L}, {0x11950,0x11959,N}, {0x119A0,0x119A7,L}, {0x119AA,0x119D0,L},
    {0x119E1,0x119E1,L}, {0x119E3,0x119E3,L}, {0x11A00,0x11A00,L}, {0x11A0B,0x11A32,L}, {0x11A3A,0x11A3A,L},
    {0x11A50,0x11A50,L}, {0x11A5C,0x11A89,L}, {0x11A9D,0x11A9D,L}, {0x11AB0,0x11AF8,L}, {0x11C00,0x11C08,L},
    {0x11C0A,0x11C2E,L}, {0x11C40,0x11C40,L}, {0x11C50,0x11C6C,N}, {0x11C72,0x11C8F,L}, {0x11D00,0x11D06,L},
    {0x11D08,0x11D09,L}, {0x11D0B,0x11D30,L}, {0x11D46,0x11D46,L}, {0x11D50,0x11D59,N}, {0x11D60,0x11D65,L},
    {0x11D67,0x11D68,L}, {0x11D6A,0x11D89,L}, {0x11D98,0x11D98,L}, {0x11DA0,0x11DA9,N}, {0x11EE0,0x11EF2,L},
    {0x11FB0,0x11FB0,L}, {0x11FC0,0x11FD4,N}, {0x12000,0x12399,L}, {0x12400,0x1246E,N}, {0x12480,0x12543,L},
    {0x12F90,0x12FF0,L}, {0x13000,0x1342E,L}, {0x14400,0x14646,L}, {0x16800,0x16A38,L}, {0x16A40,0x16A5E,L},
    {0x16A60,0x16A69,N}, {0x16A70,0x16ABE,L}, {0x16AC0,0x16AC9,N}, {0x16AD0,0x16AED,L}, {0x16B00,0x16B2F,L},
    {0x16B40,0x16B43,L}, {0x16B50,0x16B59,N}, {0x16B5B,0x16B61,N}, {0x16B63,0x16B77,L}, {0x16B7D,0x16B8F,L},
    {0x16E40,0x16E7F,L}, {0x16E80,0x16E96,N}, {0x16F00,0x16F4A,L}, {0x16F50,0x16F50,L}, {0x16F93,0x16F9F,L},
    {0x16FE0,0x16FE1,L}, {0x16FE3,0x16FE3,L}, {0x17000,0x187F7,L}, {0x18800,0x18CD5,L}, {0x18D00,0x18D08,L},
    {0x1AFF0,0x1AFF3,L}, {0x1AFF5,0x1AFFB,L}, {0x1AFFD,0x1AFFE,L}, {0x1B000,0x1B122,L}, {0x1B150,0x1B152,L},
    {0x1B164,0x1B167,L}, {0x1B170,0x1B2FB,L}, {0x1BC00,0x1BC6A,L}, {0x1BC70,0x1BC7C,L}, {0x1BC80,0x1BC88,L},
    {0x1BC90,0x1BC99,L}, {0x1D2E0,0x1D2F3,N}, {0x1D360,0x1D378,N}, {0x1D400,0x1D454,L}, {0x1D456,0x1D49C,L},
    {0x1D49E,0x1D49F,L}, {0x1D4A2,0x1D4A2,L}, {0x1D4A5,0x1D4A6,L}, {0x1D4A9,0x1D4AC,L}, {0x1D4AE,0x1D4B9,L},
    {0x1D4BB,0x1D4BB,L}, {0x1D4BD,0x1D4C3,L}, {0x1D4C5,0x1D505,L}, {0x1D507,0x1D50A,L}, {0x1D50D,0x1D514,L},
    {0x1D516,0x1D51C,L}, {0x1D51E,0x1D539,L}, {0x1D53B,0x1D53E,L}, {0x1D540,0x1D544,L}, {0x1D546,0x1D546,L},
    {0x1D54A,0x1D550,L}, {0x1D552,0x1D6A5,L}, {0x1D6A8,0x1D6C0,L}, {0x1D6C2,0x1D6DA,L}, {0x1D6DC,0x1D6FA,L},
    {0x1D6FC,0x1D714,L}, {0x1D716,0x1D734,L}, {0x1D736,0x1D74E,L}, {0x1D750,0x1D76E,L}, {0x1D770,0x1D788,L},
    {0x1D78A,0x1D7A8,L}, {0x1D7AA,0x1D7C2,L}, {0x1D7C4,0x1D7CB,L}, {0x1D7CE,0x1D7FF,N}, {0x1DF00,0x1DF1E,L},
    {0x1E100,0x1E12C,L}, {0x1E137,0x1E13D,L}, {0x1E140,0x1E149,N}, {0x1E14E,0x1E14E,L}, {0x1E290,0x1E2AD,L},
    {0x1E2C0,0x1E2EB,L}, {0x1E2F0,0x1E2F9,N}, {0x1E7E0,0x1E7E6,L}, {0x1E7E8,0x1E7EB,L}, {0x1E7ED,0x1E7EE,L},
    {0x1E7F0,0x1E7FE,L}, {0x1E800,0x1E8C4,L}, {0x1E8C7,0x1E8CF,N}, {0x1E900,0x1E943,L}, {0x1E94B,0x1E94B,L},
    {0x1E950,0x1E959,N}, {0x1EC71,0x1ECAB,N}, {0x1ECAD,0x1ECAF,N}, {0x1ECB1,0x1ECB4,N}, {0x1ED01,0x1ED2D,N},
    {0x1ED2F,0x1ED3D,N}, {0x1EE00,0x1EE03,L}, {0x1EE05,0x1EE1F,L}, {0x1EE21,0x1EE22,L}, {0x1EE24,0x1EE24,L},
    {0x1EE27,0x1EE27,L}, {0x1EE29,0x1EE32,L}, {0x1EE34,0x1EE37,L}, {0x1EE39,0x1EE39,L}, {0x1EE3B,0x1EE3B,L},
    {0x1EE42,0x1EE42,L}, {0x1EE47,0x1EE47,L}, {0x1EE49,0x1EE49,L}, {0x1EE4B,0x1EE4B,L}, {0x1EE4D,0x1EE4F,L},
    {0x1EE51,0x1EE52,L}, {0x1EE54,0x1EE54,L}, {0x1EE57,0x1EE57,L}, {0x1EE59,0x1EE59,L}, {0x1EE5B,0x1EE5B,L},
    {0x1EE5D,0x1EE5D,L}, {0x1EE5F,0x1EE5F,L}, {0x1EE61,0x1EE62,L}, {0x1EE64,0x1EE64,L}, {0x1EE67,0x1EE6A,L},
    {0x1EE6C,0x1EE72,L}, {0x1EE74,0x1EE77,L}, {0x1EE79,0x1EE7C,L}, {0x1EE7E,0x1EE7E,L}, {0x1EE80,0x1EE89,L},
    {0x1EE8B,0x1EE9B,L}, {0x1EEA1,0x1EEA3,L}, {0x1EEA5,0x1EEA9,L}, {0x1EEAB,0x1EEBB,L}, {0x1F100,0x1F10C,N},
    {0x1FBF0,0x1FBF9,N}, {0x20000,0x2A6DF,L}, {0x2A700,0x2B738,L}, {0x2B740,0x2B81D,L}, {0x2B820,0x2CEA1,L},
    {0x2CEB0,0x2EBE0,L}, {0x2F800,0x2FA1D,L}, {0x30000,0x3134A,L},
};
// clang-format on
constexpr std::size_t n_ranges = sizeof(letter_number_ranges) / sizeof(letter_number_ranges[0]);

bool is_white_space(std::int32_t c) {  // Unicode White_Space above ASCII
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}
}  // namespace

CharClass class_of_non_ascii(std::int32_t cp) {
    if (cp < 0) return CharClass::Other;
    if (cp < 0x80) return CharClass(ascii_class[cp]);
    if (is_white_space(cp)) return CharClass::Space;
    // the last range with lo <= cp
    const Range* end = letter_number_ranges + n_ranges;
    const Range* r = std::upper_bound(letter_number_ranges, end, cp,
                                      [](std::int32_t c, const Range& x) { return c < x.lo; });
    if (r == letter_number_ranges) return CharClass::Other;
    --r;
    return cp <= r->hi ? CharClass(r->k) : CharClass::Other;
}

}  // namespace detail

std::vector<std::pair<std::size_t, std::size_t>> pretokenize(std::string_view text) {
    std::vector<std::pair<std::size_t, std::size_t>> out;
    for_each_piece(text, [&](std::size_t b, std::size_t e) { out.emplace_back(b, e); });
    return out;
}

// =====================================================================================================
// UTF-8
namespace utf8 {

Errors parse_errors(const std::string& name) {
    if (name == "replace") return Errors::Replace;
    if (name == "ignore") return Errors::Ignore;
    if (name == "strict") return Errors::Strict;
    throw ValueError("errors must be 'replace', 'ignore' or 'strict', got '" + name + "'");
}

namespace {
inline bool cont(unsigned char x) { return (x & 0xC0) == 0x80; }
}  // namespace

// Python's decoder: the length of an invalid sequence is its maximal valid prefix ("maximal subpart"),
// at least 1. Surrogates ED A0..BF 80..BF decode as code points D800..DFFF ("surrogatepass").
int next(std::string_view s, std::size_t i, std::int32_t& cp) {
    const std::size_t n = s.size();
    const auto at = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
    const unsigned char c = at(i);
    cp = -1;
    if (c < 0x80) {
        cp = c;
        return 1;
    }
    if (c < 0xC2) return 1;
    if (c < 0xE0) {
        if (i + 1 < n && cont(at(i + 1))) {
            cp = ((c & 0x1F) << 6) | (at(i + 1) & 0x3F);
            return 2;
        }
        return 1;
    }
    if (c < 0xF0) {
        if (i + 1 >= n) return 1;
        const unsigned char c1 = at(i + 1);
        const unsigned char lo = c == 0xE0 ? 0xA0 : 0x80;
        if (c == 0xED && c1 >= 0xA0 && c1 <= 0xBF) {  // a surrogate: only as a whole 3-byte sequence
            if (i + 2 < n && cont(at(i + 2))) {
                cp = ((c & 0x0F) << 12) | ((c1 & 0x3F) << 6) | (at(i + 2) & 0x3F);
                return 3;
            }
            return 1;  // what strict UTF-8 says of ED A0: ED alone is the invalid subpart
        }
        if (c1 < lo || c1 > 0xBF) return 1;
        if (i + 2 >= n || !cont(at(i + 2))) return 2;
        cp = ((c & 0x0F) << 12) | ((c1 & 0x3F) << 6) | (at(i + 2) & 0x3F);
        return 3;
    }
    if (c < 0xF5) {
        if (i + 1 >= n) return 1;
        const unsigned char c1 = at(i + 1);
        const unsigned char lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        if (c1 < lo || c1 > hi) return 1;
        if (i + 2 >= n || !cont(at(i + 2))) return 2;
        if (i + 3 >= n || !cont(at(i + 3))) return 3;
        cp = ((c & 0x07) << 18) | ((c1 & 0x3F) << 12) | ((at(i + 2) & 0x3F) << 6) | (at(i + 3) & 0x3F);
        return 4;
    }
    return 1;
}

void append(std::string& out, std::uint32_t cp) {
    if (cp < 0x80) {
        out.push_back(char(cp));
    } else if (cp < 0x800) {
        out.push_back(char(0xC0 | (cp >> 6)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(char(0xE0 | (cp >> 12)));
        out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(char(0xF0 | (cp >> 18)));
        out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    }
}

std::string sanitize(std::string_view s, Errors errors) {
    std::string out;
    out.reserve(s.size());
    std::size_t i = 0;
    const std::size_t n = s.size();
    while (i < n) {
        std::size_t j = i;
        while (j < n && static_cast<unsigned char>(s[j]) < 0x80) ++j;  // ASCII run
        out.append(s.data() + i, j - i);
        i = j;
        if (i >= n) break;
        std::int32_t cp;
        const int len = next(s, i, cp);
        if (cp >= 0) {
            out.append(s.data() + i, std::size_t(len));
        } else if (errors == Errors::Replace) {
            out += "\xEF\xBF\xBD";  // U+FFFD
        } else if (errors == Errors::Strict) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "0x%02X", static_cast<unsigned char>(s[i]));
            throw ValueError("decode: the bytes of the tokens are not valid UTF-8 at byte offset " + std::to_string(i) +
                             " (byte " + buf + "); use errors='replace' or 'ignore'");
        }
        i += std::size_t(len);
    }
    return out;
}

std::size_t count_code_points(std::string_view s, std::size_t end_byte) {
    std::size_t i = 0, k = 0;
    end_byte = std::min(end_byte, s.size());
    while (i < end_byte) {
        std::int32_t cp;
        i += std::size_t(next(s, i, cp));
        ++k;
    }
    return k;
}

}  // namespace utf8

namespace {

// Text for messages and the human-readable fields of the JSON file: printable characters as they are,
// control characters, surrogates and bytes that are not UTF-8 as \xNN / \uXXXX escapes, and the
// backslash doubled (so the rendering is unambiguous).
std::string render(std::string_view s) {
    std::string out;
    char buf[16];
    std::size_t i = 0;
    while (i < s.size()) {
        std::int32_t cp;
        const int len = utf8::next(s, i, cp);
        if (cp < 0) {
            std::snprintf(buf, sizeof buf, "\\x%02X", static_cast<unsigned char>(s[i]));
            out += buf;
            i += 1;  // byte by byte, so that every byte is shown
            continue;
        }
        if (cp == '\\') {
            out += "\\\\";
        } else if (cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp < 0xA0) || (cp >= 0xD800 && cp <= 0xDFFF)) {
            if (cp == '\n') out += "\\n";
            else if (cp == '\t') out += "\\t";
            else if (cp == '\r') out += "\\r";
            else {
                std::snprintf(buf, sizeof buf, cp < 0x100 ? "\\x%02X" : "\\u%04X", unsigned(cp));
                out += buf;
            }
        } else {
            out.append(s.data() + i, std::size_t(len));
        }
        i += std::size_t(len);
    }
    return out;
}

std::string quoted(std::string_view s) { return "'" + render(s) + "'"; }

std::string code_point_name(std::uint32_t cp) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "U+%04X", cp);
    return buf;
}

// A fast 64-bit mix (for the open-addressing tables).
inline std::uint64_t mix64(std::uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}
inline std::uint64_t pair_key(token_t a, token_t b) { return (std::uint64_t(std::uint32_t(a)) << 32) | std::uint32_t(b); }
inline token_t key_left(std::uint64_t k) { return token_t(k >> 32); }
inline token_t key_right(std::uint64_t k) { return token_t(k & 0xffffffffu); }

std::size_t table_size_for(std::size_t n) {
    std::size_t cap = 16;
    while (cap < 2 * n + 2) cap <<= 1;
    return cap;
}

void check_n_vocab_fits(std::size_t n_regular, const char* who) {
    if (n_regular + 3 > std::size_t(INT32_MAX)) throw ValueError(std::string(who) + ": vocabulary too large");
}

// =====================================================================================================
// JSON: a small writer and a strict reader (objects, arrays, strings, integers, true/false/null). Only
// what the save format needs; anything else is reported as a corrupt file.
struct Json {
    enum Kind { Null, Bool, Int, Str, Arr, Obj } kind = Null;
    bool b = false;
    long long i = 0;
    std::string s;
    std::vector<Json> a;
    std::vector<std::pair<std::string, Json>> o;

    const Json* find(const std::string& key) const {
        for (auto& kv : o)
            if (kv.first == key) return &kv.second;
        return nullptr;
    }
};

[[noreturn]] void corrupt(const std::string& what) {
    throw ValueError("corrupt or truncated tokenizer file: " + what);
}

class JsonReader {
public:
    explicit JsonReader(std::string_view t) : t_(t) {}
    Json document() {
        Json v = value(0);
        ws();
        if (p_ != t_.size()) fail("unexpected text after the end of the document");
        return v;
    }

private:
    std::string_view t_;
    std::size_t p_ = 0;

    [[noreturn]] void fail(const std::string& what) const {
        corrupt(what + " (at byte " + std::to_string(p_) + " of " + std::to_string(t_.size()) + ")");
    }
    void ws() {
        while (p_ < t_.size() && (t_[p_] == ' ' || t_[p_] == '\n' || t_[p_] == '\r' || t_[p_] == '\t')) ++p_;
    }
    bool eat(char c) {
        ws();
        if (p_ < t_.size() && t_[p_] == c) {
            ++p_;
            return true;
        }
        return false;
    }
    void expect(char c) {
        if (!eat(c)) fail(p_ >= t_.size() ? std::string("unexpected end of file, expected '") + c + "'"
                                          : std::string("expected '") + c + "'");
    }
    bool literal(const char* w) {
        const std::size_t n = std::strlen(w);
        if (t_.substr(p_, n) == w) {
            p_ += n;
            return true;
        }
        return false;
    }
    Json value(int depth) {
        if (depth > 32) fail("nesting too deep");
        ws();
        if (p_ >= t_.size()) fail("unexpected end of file");
        Json v;
        const char c = t_[p_];
        if (c == '{') {
            ++p_;
            v.kind = Json::Obj;
            if (eat('}')) return v;
            do {
                ws();
                if (p_ >= t_.size() || t_[p_] != '"') fail("expected a string key");
                std::string k = string();
                for (auto& kv : v.o)
                    if (kv.first == k) fail("duplicate key \"" + render(k) + "\"");
                expect(':');
                v.o.emplace_back(std::move(k), value(depth + 1));
            } while (eat(','));
            expect('}');
        } else if (c == '[') {
            ++p_;
            v.kind = Json::Arr;
            if (eat(']')) return v;
            do v.a.push_back(value(depth + 1));
            while (eat(','));
            expect(']');
        } else if (c == '"') {
            v.kind = Json::Str;
            v.s = string();
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            v.kind = Json::Int;
            v.i = integer();
        } else if (literal("true")) {
            v.kind = Json::Bool;
            v.b = true;
        } else if (literal("false")) {
            v.kind = Json::Bool;
        } else if (literal("null")) {
            v.kind = Json::Null;
        } else {
            fail("unexpected character");
        }
        return v;
    }
    long long integer() {
        const std::size_t start = p_;
        bool neg = false;
        if (t_[p_] == '-') {
            neg = true;
            ++p_;
        }
        if (p_ >= t_.size() || !(t_[p_] >= '0' && t_[p_] <= '9')) fail("malformed number");
        if (t_[p_] == '0' && p_ + 1 < t_.size() && t_[p_ + 1] >= '0' && t_[p_ + 1] <= '9') fail("malformed number");
        long long v = 0;
        while (p_ < t_.size() && t_[p_] >= '0' && t_[p_] <= '9') {
            if (v > (INT64_MAX - 9) / 10) fail("number too large");
            v = v * 10 + (t_[p_] - '0');
            ++p_;
        }
        if (p_ < t_.size() && (t_[p_] == '.' || t_[p_] == 'e' || t_[p_] == 'E')) {
            p_ = start;
            fail("expected an integer");
        }
        return neg ? -v : v;
    }
    unsigned hex4() {
        if (p_ + 4 > t_.size()) fail("truncated \\u escape");
        unsigned v = 0;
        for (int k = 0; k < 4; ++k) {
            const char h = t_[p_++];
            v <<= 4;
            if (h >= '0' && h <= '9') v |= unsigned(h - '0');
            else if (h >= 'a' && h <= 'f') v |= unsigned(h - 'a' + 10);
            else if (h >= 'A' && h <= 'F') v |= unsigned(h - 'A' + 10);
            else fail("malformed \\u escape");
        }
        return v;
    }
    std::string string() {
        ++p_;  // opening quote
        std::string out;
        for (;;) {
            if (p_ >= t_.size()) fail("unexpected end of file inside a string");
            const unsigned char c = static_cast<unsigned char>(t_[p_]);
            if (c == '"') {
                ++p_;
                return out;
            }
            if (c < 0x20) fail("control character inside a string");
            if (c == '\\') {
                ++p_;
                if (p_ >= t_.size()) fail("unexpected end of file inside a string");
                const char e = t_[p_++];
                switch (e) {
                    case '"': out += '"'; break;
                    case '\\': out += '\\'; break;
                    case '/': out += '/'; break;
                    case 'b': out += '\b'; break;
                    case 'f': out += '\f'; break;
                    case 'n': out += '\n'; break;
                    case 'r': out += '\r'; break;
                    case 't': out += '\t'; break;
                    case 'u': {
                        unsigned cp = hex4();
                        // a surrogate pair \uD8xx\uDCxx is one code point; a lone surrogate stays one
                        if (cp >= 0xD800 && cp <= 0xDBFF && p_ + 6 <= t_.size() && t_[p_] == '\\' && t_[p_ + 1] == 'u') {
                            const std::size_t save = p_;
                            p_ += 2;
                            const unsigned lo = hex4();
                            if (lo >= 0xDC00 && lo <= 0xDFFF) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                            else p_ = save;
                        }
                        utf8::append(out, cp);
                        break;
                    }
                    default: fail("malformed escape in a string");
                }
                continue;
            }
            std::int32_t cp;
            const int len = utf8::next(t_, p_, cp);
            if (cp < 0) fail("invalid UTF-8 inside a string");
            out.append(t_.data() + p_, std::size_t(len));
            p_ += std::size_t(len);
        }
    }
};

// JSON string literal of text (UTF-8 + surrogates): surrogates and control characters escaped — except a
// high surrogate directly followed by a low one (two lone code points in a Python str): JSON readers
// (ours, Python's json) join two such escapes (backslash-u D800, backslash-u DFFF) into ONE code point
// (U+103FF), so that high surrogate is
// written as its raw surrogatepass bytes (ED A0..AF 80..BF) instead; our reader takes it back as one code
// point, as json.loads of the Python str does. So every text round-trips exactly (issue 11, item 7).
void json_string(std::string& out, std::string_view s) {
    out += '"';
    std::size_t i = 0;
    char buf[16];
    while (i < s.size()) {
        std::int32_t cp;
        const int len = utf8::next(s, i, cp);
        FT_CHECK(cp >= 0, "json_string: text is not UTF-8");
        bool pair_follows = false;
        if (cp >= 0xD800 && cp <= 0xDBFF && i + std::size_t(len) < s.size()) {
            std::int32_t next_cp;
            utf8::next(s, i + std::size_t(len), next_cp);
            pair_follows = next_cp >= 0xDC00 && next_cp <= 0xDFFF;
        }
        if (pair_follows) {
            out.append(s.data() + i, std::size_t(len));
            i += std::size_t(len);
            continue;
        }
        if (cp == '"') out += "\\\"";
        else if (cp == '\\') out += "\\\\";
        else if (cp == '\n') out += "\\n";
        else if (cp == '\t') out += "\\t";
        else if (cp == '\r') out += "\\r";
        else if (cp < 0x20 || cp == 0x7F || (cp >= 0xD800 && cp <= 0xDFFF)) {
            std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(cp));
            out += buf;
        } else {
            out.append(s.data() + i, std::size_t(len));
        }
        i += std::size_t(len);
    }
    out += '"';
}

constexpr const char* kFormat = "formal-transformers/tokenizer";
constexpr long long kVersion = 1;

std::string json_header(const char* type, const Specials& sp) {
    std::string out = "{\n  \"format\": \"";
    out += kFormat;
    out += "\",\n  \"version\": " + std::to_string(kVersion) + ",\n  \"type\": \"" + type + "\",\n";
    out += "  \"n_vocab\": " + std::to_string(sp.n_vocab) + ",\n";
    out += "  \"special_tokens\": {\"<mask>\": " + std::to_string(sp.mask()) + ", \"<bos>\": " + std::to_string(sp.bos()) +
           ", \"<eos>\": " + std::to_string(sp.eos()) + "},\n";
    return out;
}

const Json& field(const Json& d, const char* key, Json::Kind kind) {
    const Json* v = d.find(key);
    if (!v) corrupt(std::string("missing field \"") + key + "\"");
    if (v->kind != kind) corrupt(std::string("field \"") + key + "\" has the wrong type");
    return *v;
}

// The common header: format, version, type; returns the document.
Json read_document(std::string_view text, const char* type) {
    if (text.empty()) corrupt("the file is empty");
    Json d = JsonReader(text).document();
    if (d.kind != Json::Obj) corrupt("the document is not a JSON object");
    if (field(d, "format", Json::Str).s != kFormat) corrupt(std::string("\"format\" is not \"") + kFormat + "\"");
    const long long v = field(d, "version", Json::Int).i;
    if (v != kVersion)
        throw ValueError("unsupported tokenizer file version " + std::to_string(v) + " (this build reads version " +
                         std::to_string(kVersion) + ")");
    const std::string& t = field(d, "type", Json::Str).s;
    if (t != type)
        throw ValueError("the file holds a '" + render(t) + "' tokenizer, not a '" + type +
                         "' one (load it with the matching class)");
    return d;
}

// n_vocab and special_tokens must agree with the layout the content implies.
void check_layout(const Json& d, const Specials& sp) {
    const long long n = field(d, "n_vocab", Json::Int).i;
    if (n != sp.n_vocab)
        corrupt("\"n_vocab\" is " + std::to_string(n) + " but the content gives " + std::to_string(sp.n_vocab));
    const Json& s = field(d, "special_tokens", Json::Obj);
    const std::pair<const char*, token_t> want[3] = {{"<mask>", sp.mask()}, {"<bos>", sp.bos()}, {"<eos>", sp.eos()}};
    if (s.o.size() != 3) corrupt("\"special_tokens\" must have exactly <mask>, <bos>, <eos>");
    for (auto& w : want) {
        const Json* v = s.find(w.first);
        if (!v || v->kind != Json::Int || v->i != w.second)
            corrupt(std::string("\"special_tokens\" must map ") + w.first + " to " + std::to_string(w.second));
    }
}

}  // namespace

// =====================================================================================================
const char* Specials::name(token_t id) const {
    if (id == mask()) return "<mask>";
    if (id == bos()) return "<bos>";
    if (id == eos()) return "<eos>";
    return "";
}

void check_ids(const token_t* ids, std::size_t n, token_t n_vocab, const char* who) {
    for (std::size_t t = 0; t < n; ++t)
        if (ids[t] < 0 || ids[t] >= n_vocab)
            throw IndexError(std::string(who) + ": token id " + std::to_string(ids[t]) + " at position " +
                             std::to_string(t) + " is out of range [0, " + std::to_string(n_vocab) +
                             ") (n_vocab = " + std::to_string(n_vocab) + ")");
}

std::vector<std::pair<index_t, index_t>> chunk_bounds(index_t n, index_t l_max, index_t stride) {
    if (l_max < 1) throw ValueError("chunk: l_max must be a positive integer, got " + std::to_string(l_max));
    if (stride < 1 || stride > l_max)
        throw ValueError("chunk: stride must be in [1, l_max] = [1, " + std::to_string(l_max) + "], got " +
                         std::to_string(stride));
    if (n < 0) throw ValueError("chunk: negative length");
    std::vector<std::pair<index_t, index_t>> out;
    for (index_t b = 0; b < n; b += stride) {
        const index_t e = std::min(b + l_max, n);
        out.emplace_back(b, e);
        if (e == n) break;
    }
    return out;
}

// =====================================================================================================
// Byte-level BPE
namespace {
constexpr std::uint64_t kEmpty = ~std::uint64_t(0);
}  // namespace

void BPETokenizer::build() {
    const std::size_t m = merges_.size();
    check_n_vocab_fits(256 + m, "BPETokenizer");
    vocab_.clear();
    vocab_.reserve(256 + m);
    for (int b = 0; b < 256; ++b) vocab_.emplace_back(1, char(b));
    const std::size_t cap = table_size_for(m);
    mkeys_.assign(cap, kEmpty);
    mranks_.assign(cap, -1);
    mmask_ = cap - 1;
    for (std::size_t k = 0; k < m; ++k) {
        const auto [a, b] = merges_[k];
        const token_t id = token_t(256 + k);
        if (a < 0 || a >= id || b < 0 || b >= id)
            throw ValueError("BPE merge " + std::to_string(k) + " = (" + std::to_string(a) + ", " + std::to_string(b) +
                             ") uses an id that does not exist before it (ids must be < " + std::to_string(id) + ")");
        const std::uint64_t key = pair_key(a, b);
        std::uint64_t h = mix64(key) & mmask_;
        while (mkeys_[h] != kEmpty) {
            if (mkeys_[h] == key)
                throw ValueError("BPE merge " + std::to_string(k) + " = (" + std::to_string(a) + ", " + std::to_string(b) +
                                 ") repeats merge " + std::to_string(mranks_[h]));
            h = (h + 1) & mmask_;
        }
        mkeys_[h] = key;
        mranks_[h] = token_t(k);
        vocab_.push_back(vocab_[std::size_t(a)] + vocab_[std::size_t(b)]);
    }
    sp_.n_vocab = token_t(256 + m + 3);
}

token_t BPETokenizer::rank_of(token_t a, token_t b) const {
    const std::uint64_t key = pair_key(a, b);
    std::uint64_t h = mix64(key) & mmask_;
    for (;;) {
        const std::uint64_t k = mkeys_[h];
        if (k == key) return mranks_[h];
        if (k == kEmpty) return -1;
        h = (h + 1) & mmask_;
    }
}

BPETokenizer BPETokenizer::from_merges(std::vector<Merge> merges) {
    BPETokenizer t;
    t.merges_ = std::move(merges);
    t.build();
    return t;
}

const std::string& BPETokenizer::token_bytes(token_t id) const {
    if (id < 0 || id >= token_t(vocab_.size()))
        throw IndexError("token_bytes: id " + std::to_string(id) + " is not a regular token (regular ids are [0, " +
                         std::to_string(vocab_.size()) + "); specials are " + std::to_string(sp_.mask()) + ", " +
                         std::to_string(sp_.bos()) + ", " + std::to_string(sp_.eos()) + ")");
    return vocab_[std::size_t(id)];
}

// ---------------------------------------------------------------------------------------------------
// Encoding one piece: the merges by rank, lowest first; equal ranks left to right. The symbols form a
// linked list over their first byte's position; a min-heap holds (rank, position) of candidate pairs and
// is invalidated lazily (an entry is used only if merge `rank` still matches the pair at `position`).
// A merge of rank r only creates pairs containing the new id 256 + r, whose merges (if any) have ranks
// > r, so this applies exactly the same merges as GPT-2's loop (encode_piece_naive), in O(n log n).
void BPETokenizer::encode_piece(std::string_view piece, std::vector<token_t>& out) const {
    const std::size_t n = piece.size();
    if (n == 0) return;
    if (n == 1 || merges_.empty()) {
        for (char c : piece) out.push_back(token_t(static_cast<unsigned char>(c)));
        return;
    }
    thread_local std::vector<token_t> id;
    thread_local std::vector<std::int32_t> nxt, prv;
    thread_local std::vector<std::uint64_t> heap;  // rank << 32 | position, min-heap via std::greater
    id.resize(n);
    nxt.resize(n);
    prv.resize(n);
    heap.clear();
    for (std::size_t i = 0; i < n; ++i) {
        id[i] = token_t(static_cast<unsigned char>(piece[i]));
        nxt[i] = std::int32_t(i + 1);  // n = end
        prv[i] = std::int32_t(i) - 1;
    }
    for (std::size_t i = 0; i + 1 < n; ++i) {
        const token_t r = rank_of(id[i], id[i + 1]);
        if (r >= 0) heap.push_back((std::uint64_t(r) << 32) | i);
    }
    std::make_heap(heap.begin(), heap.end(), std::greater<>());
    const std::int32_t end = std::int32_t(n);
    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end(), std::greater<>());
        const std::uint64_t e = heap.back();
        heap.pop_back();
        const token_t r = token_t(e >> 32);
        const std::int32_t i = std::int32_t(e & 0xffffffffu);
        if (id[std::size_t(i)] < 0) continue;  // merged into its left neighbour
        const std::int32_t j = nxt[std::size_t(i)];
        if (j == end) continue;
        const Merge& mg = merges_[std::size_t(r)];
        if (id[std::size_t(i)] != mg.first || id[std::size_t(j)] != mg.second) continue;  // stale
        // merge symbols i and j into 256 + r
        id[std::size_t(i)] = token_t(256 + r);
        id[std::size_t(j)] = -1;
        const std::int32_t k = nxt[std::size_t(j)];
        nxt[std::size_t(i)] = k;
        if (k != end) prv[std::size_t(k)] = i;
        const std::int32_t p = prv[std::size_t(i)];
        if (p >= 0) {
            const token_t r2 = rank_of(id[std::size_t(p)], id[std::size_t(i)]);
            if (r2 >= 0) {
                heap.push_back((std::uint64_t(r2) << 32) | std::uint64_t(p));
                std::push_heap(heap.begin(), heap.end(), std::greater<>());
            }
        }
        if (k != end) {
            const token_t r2 = rank_of(id[std::size_t(i)], id[std::size_t(k)]);
            if (r2 >= 0) {
                heap.push_back((std::uint64_t(r2) << 32) | std::uint64_t(i));
                std::push_heap(heap.begin(), heap.end(), std::greater<>());
            }
        }
    }
    for (std::int32_t i = 0; i != end; i = nxt[std::size_t(i)]) out.push_back(id[std::size_t(i)]);
}

void BPETokenizer::encode_piece_naive(std::string_view piece, std::vector<token_t>& out) const {
    std::vector<token_t> w;
    for (char c : piece) w.push_back(token_t(static_cast<unsigned char>(c)));
    for (;;) {
        token_t best = -1;
        for (std::size_t i = 0; i + 1 < w.size(); ++i) {
            const token_t r = rank_of(w[i], w[i + 1]);
            if (r >= 0 && (best < 0 || r < best)) best = r;
        }
        if (best < 0) break;
        const Merge mg = merges_[std::size_t(best)];
        std::vector<token_t> v;
        for (std::size_t i = 0; i < w.size();) {
            if (i + 1 < w.size() && w[i] == mg.first && w[i + 1] == mg.second) {
                v.push_back(token_t(256 + best));
                i += 2;
            } else {
                v.push_back(w[i++]);
            }
        }
        w.swap(v);
    }
    out.insert(out.end(), w.begin(), w.end());
}

namespace {
// Per-call cache of piece -> ids (the pieces of natural text repeat a lot): open addressing, keys view the
// caller's text (alive for the call), values are ranges of one flat id store.
class PieceCache {
public:
    PieceCache() { slots_.assign(1024, Slot{}); }
    // the cached ids of `piece`, or nullptr; `h` is hash(piece)
    const token_t* find(std::string_view piece, std::uint64_t h, std::uint32_t& count) const {
        for (std::size_t i = h & (slots_.size() - 1);; i = (i + 1) & (slots_.size() - 1)) {
            const Slot& s = slots_[i];
            if (!s.p) return nullptr;
            if (s.h == h && s.len == piece.size() && std::memcmp(s.p, piece.data(), piece.size()) == 0) {
                count = s.cnt;
                return store_.data() + s.off;
            }
        }
    }
    void insert(std::string_view piece, std::uint64_t h, const token_t* ids, std::uint32_t count) {
        if (used_ >= kMaxEntries || store_.size() + count > UINT32_MAX) return;
        if (2 * (used_ + 1) > slots_.size()) grow();
        place(Slot{h, piece.data(), std::uint32_t(piece.size()), std::uint32_t(store_.size()), count});
        store_.insert(store_.end(), ids, ids + count);
        ++used_;
    }
    static std::uint64_t hash(std::string_view s) {
        const char* p = s.data();
        std::size_t n = s.size();
        std::uint64_t h = 0x9E3779B97F4A7C15ULL ^ n;
        while (n >= 8) {
            std::uint64_t v;
            std::memcpy(&v, p, 8);
            h = (h ^ v) * 0xff51afd7ed558ccdULL;
            h ^= h >> 32;
            p += 8;
            n -= 8;
        }
        std::uint64_t v = 0;
        std::memcpy(&v, p, n);
        return mix64(h ^ v);
    }

private:
    struct Slot {
        std::uint64_t h = 0;
        const char* p = nullptr;  // nullptr: empty
        std::uint32_t len = 0, off = 0, cnt = 0;
    };
    static constexpr std::size_t kMaxEntries = std::size_t(1) << 22;
    std::vector<Slot> slots_;
    std::vector<token_t> store_;
    std::size_t used_ = 0;

    void place(const Slot& s) {
        std::size_t i = s.h & (slots_.size() - 1);
        while (slots_[i].p) i = (i + 1) & (slots_.size() - 1);
        slots_[i] = s;
    }
    void grow() {
        std::vector<Slot> old(slots_.size() * 2, Slot{});
        old.swap(slots_);
        for (const Slot& s : old)
            if (s.p) place(s);
    }
};

void encode_text(const BPETokenizer& t, std::string_view text, PieceCache& cache, std::vector<token_t>& out) {
    for_each_piece(text, [&](std::size_t b, std::size_t e) {
        const std::string_view piece = text.substr(b, e - b);
        if (piece.size() == 1) {
            out.push_back(token_t(static_cast<unsigned char>(piece[0])));
            return;
        }
        const std::uint64_t h = PieceCache::hash(piece);
        std::uint32_t count = 0;
        if (const token_t* ids = cache.find(piece, h, count)) {
            out.insert(out.end(), ids, ids + count);
            return;
        }
        const std::size_t start = out.size();
        t.encode_piece(piece, out);
        cache.insert(piece, h, out.data() + start, std::uint32_t(out.size() - start));
    });
}
}  // namespace

std::vector<token_t> BPETokenizer::encode(std::string_view text, bool bos, bool eos) const {
    std::vector<token_t> out;
    out.reserve(text.size() / 3 + 2);
    if (bos) out.push_back(sp_.bos());
    PieceCache cache;
    encode_text(*this, text, cache, out);
    if (eos) out.push_back(sp_.eos());
    return out;
}

std::vector<std::vector<token_t>> BPETokenizer::encode_batch(const std::vector<std::string_view>& texts, bool bos,
                                                             bool eos) const {
    std::vector<std::vector<token_t>> out(texts.size());
    PieceCache cache;
    for (std::size_t k = 0; k < texts.size(); ++k) {
        if (bos) out[k].push_back(sp_.bos());
        encode_text(*this, texts[k], cache, out[k]);
        if (eos) out[k].push_back(sp_.eos());
        if ((k & 1023) == 1023) poll();
    }
    return out;
}

std::string BPETokenizer::decode_bytes(const token_t* ids, std::size_t n, bool skip_special) const {
    check_ids(ids, n, sp_.n_vocab, "decode");
    std::string out;
    for (std::size_t t = 0; t < n; ++t) {
        const token_t v = ids[t];
        if (v < token_t(vocab_.size())) out += vocab_[std::size_t(v)];
        else if (!skip_special) out += sp_.name(v);
    }
    return out;
}

std::string BPETokenizer::decode(const token_t* ids, std::size_t n, bool skip_special, utf8::Errors errors) const {
    return utf8::sanitize(decode_bytes(ids, n, skip_special), errors);
}

// ---------------------------------------------------------------------------------------------------
// Training (the standard incremental algorithm):
//   1. count the pre-tokenizer's pieces ("words") of the text; each unique word is a sequence of byte ids
//      with a frequency c_w;
//   2. count every adjacent pair over the words, weighted by c_w, and index pair -> words holding it;
//   3. repeat: take the pair with the highest count (ties: smallest (left, right)) from a max-heap whose
//      entries may be stale (an entry whose count no longer matches is re-pushed with the current one;
//      counts of old pairs only decrease, so the first matching entry is the true maximum); append the
//      merge; rewrite only the words that hold the pair, collecting the count changes of the pairs
//      around each occurrence; apply them and push the pairs that the merge created.
BPETokenizer BPETokenizer::train(std::string_view text, index_t n_vocab, index_t min_frequency) {
    if (n_vocab < 259)
        throw ValueError("BPETokenizer.train: n_vocab must be at least 259 = 256 byte tokens + 3 special tokens "
                         "(mask, bos, eos), got " + std::to_string(n_vocab));
    if (n_vocab > INT32_MAX) throw ValueError("BPETokenizer.train: n_vocab too large: " + std::to_string(n_vocab));
    if (min_frequency < 1)
        throw ValueError("BPETokenizer.train: min_frequency must be >= 1, got " + std::to_string(min_frequency));
    const std::size_t target = std::size_t(n_vocab - 259);

    // 1. words
    std::unordered_map<std::string_view, std::int64_t> piece_count;
    for_each_piece(text, [&](std::size_t b, std::size_t e) { ++piece_count[text.substr(b, e - b)]; });
    poll();
    std::vector<std::vector<token_t>> words;
    std::vector<std::int64_t> wcount;
    words.reserve(piece_count.size());
    wcount.reserve(piece_count.size());
    for (auto& [piece, c] : piece_count) {
        if (piece.size() < 2) continue;  // no pair inside
        std::vector<token_t> w(piece.size());
        for (std::size_t i = 0; i < piece.size(); ++i) w[i] = token_t(static_cast<unsigned char>(piece[i]));
        words.push_back(std::move(w));
        wcount.push_back(c);
    }
    piece_count = {};

    // 2. pair counts and the pair -> words index
    std::unordered_map<std::uint64_t, std::int64_t> count;
    std::unordered_map<std::uint64_t, std::vector<std::int32_t>> where;
    for (std::size_t w = 0; w < words.size(); ++w) {
        const auto& s = words[w];
        for (std::size_t i = 0; i + 1 < s.size(); ++i) {
            const std::uint64_t k = pair_key(s[i], s[i + 1]);
            count[k] += wcount[w];
            auto& ws = where[k];
            if (ws.empty() || ws.back() != std::int32_t(w)) ws.push_back(std::int32_t(w));
        }
    }
    struct Entry {
        std::int64_t count;
        std::uint64_t pair;
        bool operator<(const Entry& o) const {  // "lower priority than": fewer, or as many and a larger pair
            return count < o.count || (count == o.count && pair > o.pair);
        }
    };
    std::vector<Entry> init;
    init.reserve(count.size());
    for (auto& [k, c] : count) init.push_back({c, k});
    std::priority_queue<Entry> heap(std::less<Entry>(), std::move(init));
    poll();

    // 3. merges
    std::vector<Merge> merges;
    merges.reserve(std::min<std::size_t>(target, count.size()));  // n_vocab may be far beyond what the text allows
    std::vector<std::pair<std::uint64_t, std::int64_t>> delta;  // (pair, change of count)
    std::vector<std::pair<std::uint64_t, std::int32_t>> created;  // (new pair, word)
    while (merges.size() < target && !heap.empty()) {
        const Entry top = heap.top();
        heap.pop();
        auto cit = count.find(top.pair);
        const std::int64_t cur = cit == count.end() ? 0 : cit->second;
        if (cur != top.count) {  // stale
            if (cur > 0) heap.push({cur, top.pair});
            continue;
        }
        if (cur < min_frequency) break;
        const token_t a = key_left(top.pair), b = key_right(top.pair);
        const token_t X = token_t(256 + merges.size());
        merges.emplace_back(a, b);

        delta.clear();
        created.clear();
        auto wit = where.find(top.pair);
        std::vector<std::int32_t> ws;
        if (wit != where.end()) {
            ws = std::move(wit->second);
            where.erase(wit);
        }
        for (const std::int32_t w : ws) {
            auto& s = words[std::size_t(w)];
            const std::int64_t c = wcount[std::size_t(w)];
            const std::size_t n = s.size();
            std::size_t o = 0;  // rewrite in place: s[0, o) is the output so far, s[i, n) the input left
            for (std::size_t i = 0; i < n;) {
                if (i + 1 < n && s[i] == a && s[i + 1] == b) {
                    if (o > 0) {  // the pair on the left: (p, a) becomes (p, X)
                        const token_t p = s[o - 1];
                        delta.emplace_back(pair_key(p, a), -c);
                        delta.emplace_back(pair_key(p, X), +c);
                        created.emplace_back(pair_key(p, X), w);
                    }
                    if (i + 2 < n) {  // the pair on the right: (b, x) becomes (X, x)
                        const token_t x = s[i + 2];
                        delta.emplace_back(pair_key(b, x), -c);
                        delta.emplace_back(pair_key(X, x), +c);
                        created.emplace_back(pair_key(X, x), w);
                    }
                    s[o++] = X;
                    i += 2;
                } else {
                    s[o++] = s[i++];
                }
            }
            s.resize(o);
        }
        count.erase(top.pair);
        // apply the changes, summed per pair
        std::sort(delta.begin(), delta.end());
        for (std::size_t k = 0; k < delta.size();) {
            const std::uint64_t p = delta[k].first;
            std::int64_t d = 0;
            for (; k < delta.size() && delta[k].first == p; ++k) d += delta[k].second;
            if (p == top.pair || d == 0) continue;
            auto it = count.find(p);
            std::int64_t& c = it == count.end() ? count[p] : it->second;
            c += d;
            FT_CHECK(c >= 0, "BPE training: negative pair count");
            if (c == 0) {
                count.erase(p);
                where.erase(p);
            } else if (d > 0) {
                heap.push({c, p});
            }
        }
        for (auto& [p, w] : created) {
            if (!count.count(p)) continue;
            auto& list = where[p];
            if (list.empty() || list.back() != w) list.push_back(w);
        }
        poll();
    }
    return from_merges(std::move(merges));
}

// ---------------------------------------------------------------------------------------------------
// Save format: see docs/tokenization.md. "merges" is authoritative; the text after each pair (the new
// token's bytes, rendered) is for the reader and is checked on load.
std::string BPETokenizer::to_json() const {
    std::string out = json_header("bpe", sp_);
    out += "  \"pre_tokenizer\": \"gpt2\",\n";
    out += "  \"merges\": [";
    for (std::size_t k = 0; k < merges_.size(); ++k) {
        out += k ? ",\n    [" : "\n    [";
        out += std::to_string(merges_[k].first) + ", " + std::to_string(merges_[k].second) + ", ";
        json_string(out, render(vocab_[256 + k]));
        out += "]";
    }
    out += merges_.empty() ? "]\n}\n" : "\n  ]\n}\n";
    return out;
}

BPETokenizer BPETokenizer::from_json(std::string_view text) {
    const Json d = read_document(text, "bpe");
    if (field(d, "pre_tokenizer", Json::Str).s != "gpt2") corrupt("\"pre_tokenizer\" must be \"gpt2\"");
    const Json& m = field(d, "merges", Json::Arr);
    std::vector<Merge> merges;
    merges.reserve(m.a.size());
    for (std::size_t k = 0; k < m.a.size(); ++k) {
        const Json& e = m.a[k];
        if (e.kind != Json::Arr || e.a.size() != 3 || e.a[0].kind != Json::Int || e.a[1].kind != Json::Int ||
            e.a[2].kind != Json::Str)
            corrupt("merge " + std::to_string(k) + " is not [left id, right id, text]");
        const long long lim = 256 + (long long)k;
        if (e.a[0].i < 0 || e.a[0].i >= lim || e.a[1].i < 0 || e.a[1].i >= lim)
            corrupt("merge " + std::to_string(k) + " uses an id that does not exist before it");
        merges.emplace_back(token_t(e.a[0].i), token_t(e.a[1].i));
    }
    BPETokenizer t;
    t.merges_ = std::move(merges);
    try {
        t.build();
    } catch (const ValueError& e) {
        corrupt(e.what());
    }
    for (std::size_t k = 0; k < m.a.size(); ++k)
        if (m.a[k].a[2].s != render(t.vocab_[256 + k]))
            corrupt("merge " + std::to_string(k) + ": its text \"" + render(m.a[k].a[2].s) +
                    "\" does not match the merged tokens \"" + render(render(t.vocab_[256 + k])) + "\"");
    check_layout(d, t.sp_);
    return t;
}

// =====================================================================================================
// Character-level tokenizer
namespace {
// The code points of text (must be UTF-8 + surrogates, as a Python str gives).
template <class F>
void for_each_code_point(std::string_view text, const char* who, F&& f) {
    std::size_t i = 0, k = 0;
    while (i < text.size()) {
        std::int32_t cp;
        const int len = utf8::next(text, i, cp);
        if (cp < 0)
            throw ValueError(std::string(who) + ": the text is not valid UTF-8 at byte " + std::to_string(i));
        f(std::uint32_t(cp), i, std::size_t(len), k);
        i += std::size_t(len);
        ++k;
    }
}

std::string describe_char(std::uint32_t cp) {
    std::string c;
    utf8::append(c, cp);
    return quoted(c) + " (" + code_point_name(cp) + ")";
}
}  // namespace

CharTokenizer CharTokenizer::from_chars(std::vector<std::uint32_t> chars, bool unk) {
    for (std::size_t k = 0; k < chars.size(); ++k) {
        if (chars[k] > 0x10FFFF) throw ValueError("CharTokenizer: " + code_point_name(chars[k]) + " is not a code point");
        if (k && chars[k] <= chars[k - 1])
            throw ValueError("CharTokenizer: the characters must be distinct and in code point order (" +
                             describe_char(chars[k]) + " at index " + std::to_string(k) + ")");
    }
    check_n_vocab_fits(chars.size() + 1, "CharTokenizer");
    CharTokenizer t;
    t.chars_ = std::move(chars);
    t.unk_ = unk;
    std::fill(std::begin(t.ascii_), std::end(t.ascii_), token_t(-1));
    for (std::size_t k = 0; k < t.chars_.size() && t.chars_[k] < 256; ++k) t.ascii_[t.chars_[k]] = token_t(k);
    t.sp_.n_vocab = token_t(t.chars_.size() + (unk ? 1 : 0) + 3);
    return t;
}

CharTokenizer CharTokenizer::fit(std::string_view text, bool unk) {
    if (text.empty()) throw ValueError("CharTokenizer.fit: the text is empty (no characters to build a vocabulary)");
    std::vector<bool> seen(0x110000, false);
    for_each_code_point(text, "CharTokenizer.fit", [&](std::uint32_t cp, std::size_t, std::size_t, std::size_t) { seen[cp] = true; });
    std::vector<std::uint32_t> chars;
    for (std::uint32_t c = 0; c < 0x110000; ++c)
        if (seen[c]) chars.push_back(c);
    return from_chars(std::move(chars), unk);
}

token_t CharTokenizer::lookup(std::uint32_t cp) const {
    if (cp < 256) return ascii_[cp];
    auto it = std::lower_bound(chars_.begin(), chars_.end(), cp);
    return it != chars_.end() && *it == cp ? token_t(it - chars_.begin()) : token_t(-1);
}

std::vector<token_t> CharTokenizer::encode(std::string_view text, bool bos, bool eos) const {
    std::vector<token_t> out;
    out.reserve(text.size() + 2);
    if (bos) out.push_back(sp_.bos());
    for_each_code_point(text, "CharTokenizer.encode", [&](std::uint32_t cp, std::size_t, std::size_t, std::size_t k) {
        token_t v = lookup(cp);
        if (v < 0) {
            if (!unk_)
                throw ValueError("CharTokenizer.encode: character " + describe_char(cp) + " at position " +
                                 std::to_string(k) +
                                 " is not in the vocabulary (fit with unk=True to map unknown characters to unk_token)");
            v = unk_token();
        }
        out.push_back(v);
    });
    if (eos) out.push_back(sp_.eos());
    return out;
}

std::string CharTokenizer::decode(const token_t* ids, std::size_t n, bool skip_special) const {
    check_ids(ids, n, sp_.n_vocab, "decode");
    std::string out;
    out.reserve(n);
    for (std::size_t t = 0; t < n; ++t) {
        const token_t v = ids[t];
        if (v < token_t(chars_.size())) utf8::append(out, chars_[std::size_t(v)]);
        else if (v == unk_token()) out += "\xEF\xBF\xBD";  // U+FFFD
        else if (!skip_special) out += sp_.name(v);
    }
    return out;
}

std::string CharTokenizer::to_json() const {
    std::string out = json_header("char", sp_);
    out += std::string("  \"unk\": ") + (unk_ ? "true" : "false") + ",\n  \"chars\": [";
    for (std::size_t k = 0; k < chars_.size(); ++k) {
        out += k == 0 ? "" : (k % 16 == 0 ? ",\n    " : ", ");
        std::string c;
        utf8::append(c, chars_[k]);
        json_string(out, c);
    }
    out += "]\n}\n";
    return out;
}

CharTokenizer CharTokenizer::from_json(std::string_view text) {
    const Json d = read_document(text, "char");
    const bool unk = field(d, "unk", Json::Bool).b;
    const Json& a = field(d, "chars", Json::Arr);
    std::vector<std::uint32_t> chars;
    for (std::size_t k = 0; k < a.a.size(); ++k) {
        const Json& e = a.a[k];
        std::int32_t cp = -1;
        if (e.kind != Json::Str || e.s.empty() || std::size_t(utf8::next(e.s, 0, cp)) != e.s.size() || cp < 0)
            corrupt("chars[" + std::to_string(k) + "] is not a string of exactly one character");
        chars.push_back(std::uint32_t(cp));
    }
    CharTokenizer t;
    try {
        t = from_chars(std::move(chars), unk);
    } catch (const ValueError& e) {
        corrupt(e.what());
    }
    check_layout(d, t.sp_);
    return t;
}

// =====================================================================================================
// Word-level tokenizer: the words are the pre-tokenizer's pieces.
void WordTokenizer::build() {
    check_n_vocab_fits(words_.size() + 1, "WordTokenizer");
    const std::size_t cap = table_size_for(words_.size());
    table_.assign(cap, -1);
    tmask_ = cap - 1;
    const std::hash<std::string_view> hash;
    for (std::size_t k = 0; k < words_.size(); ++k) {
        const std::string& w = words_[k];
        if (w.empty()) throw ValueError("WordTokenizer: word " + std::to_string(k) + " is empty");
        std::size_t pieces = 0, first_end = 0;
        for_each_piece(w, [&](std::size_t, std::size_t e) {
            if (pieces++ == 0) first_end = e;
        });
        for_each_code_point(w, "WordTokenizer", [](std::uint32_t, std::size_t, std::size_t, std::size_t) {});
        if (pieces != 1 || first_end != w.size())
            throw ValueError("WordTokenizer: word " + std::to_string(k) + " " + quoted(w) +
                             " is not a single piece of the pre-tokenizer, so no text would ever produce it");
        std::uint64_t h = mix64(hash(w)) & tmask_;
        while (table_[h] >= 0) {
            if (words_[std::size_t(table_[h])] == w)
                throw ValueError("WordTokenizer: word " + std::to_string(k) + " " + quoted(w) + " repeats word " +
                                 std::to_string(table_[h]));
            h = (h + 1) & tmask_;
        }
        table_[h] = token_t(k);
    }
    sp_.n_vocab = token_t(words_.size() + (unk_ ? 1 : 0) + 3);
}

token_t WordTokenizer::lookup(std::string_view w) const {
    std::uint64_t h = mix64(std::hash<std::string_view>()(w)) & tmask_;
    for (;;) {
        const token_t k = table_[h];
        if (k < 0) return -1;
        if (words_[std::size_t(k)] == w) return k;
        h = (h + 1) & tmask_;
    }
}

WordTokenizer WordTokenizer::from_words(std::vector<std::string> words, bool unk) {
    WordTokenizer t;
    t.words_ = std::move(words);
    t.unk_ = unk;
    t.build();
    return t;
}

WordTokenizer WordTokenizer::fit(std::string_view text, bool unk, index_t min_count, index_t max_words) {
    if (text.empty()) throw ValueError("WordTokenizer.fit: the text is empty (no words to build a vocabulary)");
    if (min_count < 1) throw ValueError("WordTokenizer.fit: min_count must be >= 1, got " + std::to_string(min_count));
    if (max_words < 0) throw ValueError("WordTokenizer.fit: max_words must be >= 0 (0: no limit), got " + std::to_string(max_words));
    for_each_code_point(text, "WordTokenizer.fit", [](std::uint32_t, std::size_t, std::size_t, std::size_t) {});
    std::unordered_map<std::string_view, std::int64_t> counts;
    for_each_piece(text, [&](std::size_t b, std::size_t e) { ++counts[text.substr(b, e - b)]; });
    std::vector<std::pair<std::int64_t, std::string_view>> items;
    for (auto& [w, c] : counts)
        if (c >= min_count) items.emplace_back(c, w);
    std::sort(items.begin(), items.end(), [](const auto& x, const auto& y) {
        return x.first != y.first ? x.first > y.first : x.second < y.second;
    });
    if (max_words > 0 && items.size() > std::size_t(max_words)) items.resize(std::size_t(max_words));
    std::vector<std::string> words;
    words.reserve(items.size());
    for (auto& it : items) words.emplace_back(it.second);
    return from_words(std::move(words), unk);
}

std::vector<token_t> WordTokenizer::encode(std::string_view text, bool bos, bool eos) const {
    for_each_code_point(text, "WordTokenizer.encode", [](std::uint32_t, std::size_t, std::size_t, std::size_t) {});
    std::vector<token_t> out;
    out.reserve(text.size() / 4 + 2);
    if (bos) out.push_back(sp_.bos());
    for_each_piece(text, [&](std::size_t b, std::size_t e) {
        const std::string_view w = text.substr(b, e - b);
        token_t v = lookup(w);
        if (v < 0) {
            if (!unk_)
                throw ValueError("WordTokenizer.encode: word " + quoted(w) + " at position " +
                                 std::to_string(utf8::count_code_points(text, b)) +
                                 " is not in the vocabulary (fit with unk=True to map unknown words to unk_token)");
            v = unk_token();
        }
        out.push_back(v);
    });
    if (eos) out.push_back(sp_.eos());
    return out;
}

std::string WordTokenizer::decode(const token_t* ids, std::size_t n, bool skip_special) const {
    check_ids(ids, n, sp_.n_vocab, "decode");
    std::string out;
    for (std::size_t t = 0; t < n; ++t) {
        const token_t v = ids[t];
        if (v < token_t(words_.size())) out += words_[std::size_t(v)];
        else if (v == unk_token()) out += "<unk>";
        else if (!skip_special) out += sp_.name(v);
    }
    return out;
}

std::string WordTokenizer::to_json() const {
    std::string out = json_header("word", sp_);
    out += "  \"pre_tokenizer\": \"gpt2\",\n";
    out += std::string("  \"unk\": ") + (unk_ ? "true" : "false") + ",\n  \"words\": [";
    for (std::size_t k = 0; k < words_.size(); ++k) {
        out += k == 0 ? "" : (k % 8 == 0 ? ",\n    " : ", ");
        json_string(out, words_[k]);
    }
    out += "]\n}\n";
    return out;
}

WordTokenizer WordTokenizer::from_json(std::string_view text) {
    const Json d = read_document(text, "word");
    if (field(d, "pre_tokenizer", Json::Str).s != "gpt2") corrupt("\"pre_tokenizer\" must be \"gpt2\"");
    const bool unk = field(d, "unk", Json::Bool).b;
    const Json& a = field(d, "words", Json::Arr);
    std::vector<std::string> words;
    for (std::size_t k = 0; k < a.a.size(); ++k) {
        if (a.a[k].kind != Json::Str) corrupt("words[" + std::to_string(k) + "] is not a string");
        words.push_back(a.a[k].s);
    }
    WordTokenizer t;
    try {
        t = from_words(std::move(words), unk);
    } catch (const ValueError& e) {
        corrupt(e.what());
    }
    check_layout(d, t.sp_);
    return t;
}

}  // namespace ft
